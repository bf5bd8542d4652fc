"""Heat, power and memory pressure, and what the batch size does about them (DESIGN §5).

- ``reading``: ``Reading`` (one snapshot of the signals) and the ``Probe`` protocol.
- ``probes``: psutil, scripted probes and ``default_probes``; ``macos`` holds the
  macOS sources (pmset, notify(3) thermal pressure), ``throughput`` the engine's own
  decode rate. Each is a ``Probe`` with one ``read()`` method, so tests script a heat-up.
- ``grading``: reading -> nominal / fair / serious / critical (thresholds, hysteresis).
- ``policies``: how each mode reacts (the mode table).
- ``governor``: ``ThermalGovernor``: readings -> nominal / fair / serious / critical ->
  batch cap (additive increase, multiplicative decrease), cool-down pauses, modes.
  *Why the batch size dropped* is answered here (``Decision.reason``).

May import: ``errors``, ``options``, ``units``, ``platform`` (bottom layer). Used by ``runtime``.
"""
