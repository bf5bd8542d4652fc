"""``mlotspark`` command line. One module per command; each has ``register(sub)``;
``entry`` builds the parser of them all and holds ``main`` (the ``mlotspark`` script).

A user mistake prints one line ``mlotspark: error: ...`` and exits 2; Ctrl+C exits
130 without a traceback.

May import anything in ``mlotspark`` and the ``tui`` package (``chat``); nothing imports it.
Heavy modules (MLX, the engine) are imported inside the commands that need them, so
``--help`` and the light commands start fast.
"""
