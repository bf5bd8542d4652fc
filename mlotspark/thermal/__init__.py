"""Heat, power and memory pressure, and what the batch size does about them (DESIGN §5).

- ``probes``: the signals (psutil, ``pmset -g therm``, macOS thermal pressure, the
  engine's own throughput), each a ``Probe`` with one ``read()`` method, so tests
  script a heat-up.
- ``governor``: ``ThermalGovernor``: readings -> nominal / fair / serious / critical ->
  batch cap (additive increase, multiplicative decrease), cool-down pauses, modes.
  *Why the batch size dropped* is answered here (``Decision.reason``).

May import: ``errors``, ``platform`` (bottom layer). Used by ``runtime``.
"""
