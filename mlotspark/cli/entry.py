"""The ``mlotspark`` entry point: the parser of every command, and ``main``."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from mlotspark.platform import blas  # noqa: F401  (OpenBLAS before MLX)
from mlotspark.errors import MlotsparkError, OptionError
from mlotspark.cli import bench, chat, check, generate, memory, models, ps, serve
from mlotspark.cli.common import flag

# Command modules in the order --help lists them.
COMMANDS = [chat, generate, models, memory, bench, check, serve, ps]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one line (argparse prints the whole usage
    first: 26 lines for ``generate --temp abc``)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mlotspark",
        description="A desktop LLM inference engine on MLX, with a memory cascade.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    models.add_models_dir(parser, *sub.choices.values())
    return parser

def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    func: Callable[[argparse.Namespace], int] = args.func
    models.apply_models_dir(args)
    slow = blas.blas_warning()
    if slow:  # the one loud line: a fresh install that runs 10x slower must not go unnoticed
        print(f"mlotspark: warning: {slow}", file=sys.stderr)
    try:
        return func(args)
    except OptionError as e:  # named by the flags the user typed, not the API's names
        print(f"mlotspark: error: {e.render(flag)}", file=sys.stderr)
        return 2
    except MlotsparkError as e:
        print(f"mlotspark: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nmlotspark: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
