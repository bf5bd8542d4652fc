"""Loads GGUF files named on stdin, one per line, and answers one JSON line each:
``["ok"]``, ``["typed", class, message]`` or ``["untyped", class, message]``.
A death by signal or a hang is seen by the caller (``rel_corrupt.GgufWorker``)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def main() -> None:
    from mlotspark.errors import MlotsparkError
    from mlotspark.models import loader
    from mlotspark.models.hub.catalogue import ModelSource

    for line in sys.stdin:
        path = Path(line.strip())
        try:
            loaded = loader.load(ModelSource(path.name, "gguf", path), weights="float32")
            loaded.tokenizer.encode("hello")
            answer = ["ok"]
        except MlotsparkError as e:
            answer = ["typed", type(e).__name__, str(e)]
        except Exception as e:  # noqa: BLE001  what the test looks for
            tb = traceback.format_exc().strip().splitlines()[-3:]
            answer = ["untyped", type(e).__name__, f"{e} | {' / '.join(tb)}"]
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
