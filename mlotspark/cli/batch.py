"""``mlotspark generate --prompts FILE``: a file of prompts through the batcher.

The file has one prompt per line, or JSON objects (one a line) with ``prompt`` (or
``messages``) and any generation option (``max_tokens``, ``temperature``, ...).
Results go to a JSONL file as they finish, one line per (prompt, sequence), so an
interrupted run keeps what it finished; running the same command again skips those.
Also the scheduler flags every engine-loading command shares.
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from mlotspark.errors import OptionError
from mlotspark.thermal.governor import MODES
from mlotspark.options import GenerationOptions
from mlotspark.runtime.scheduler_config import parse_memory_limit
from mlotspark.cli.common import note, positive_int

# Several replies per prompt are separate requests here, so they batch.
_PER_REQUEST = "num_return_sequences"


@dataclass
class PromptSpec:
    """One prompt of the file: its 0-based index, text or messages, and options."""

    index: int
    prompt: str | list[dict]
    options: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------- flags
def add_scheduler_args(p: argparse.ArgumentParser) -> None:
    """``--mode``, ``--max-batch`` and ``--memory-limit``."""
    g = p.add_argument_group("scheduling")
    g.add_argument("--mode", choices=MODES, default="auto",
                   help="thermal mode; auto = balanced on AC power, efficiency on battery or in macOS Low "
                        "Power Mode (default auto); efficiency decodes at most a quarter of --max-batch "
                        "together (the mode wins)")
    g.add_argument("--max-batch", type=positive_int, default=None,
                   help="most requests decoded together (default 8)")
    g.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="keep weights + projected KV under SIZE (e.g. 8GB or 512MB, powers of 1024; also "
                        "MLX's memory limit); new requests wait until they fit (default: the recommended "
                        "working set on Metal, else none: the memory available now decides)")


def scheduler_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine.load`` keyword arguments from the scheduling flags (validated).

    When ``--mode`` lowers a ``--max-batch`` the user gave, says so once on stderr.
    """
    from mlotspark.runtime.scheduler_config import SchedulerConfig

    mode, given = getattr(args, "mode", "auto"), getattr(args, "max_batch", None)
    config = SchedulerConfig(mode=mode, max_batch=given or 8)
    if given is not None and config.mode_cap() < given:
        note(f"--mode {mode} decodes at most {config.mode_cap()} request(s) together "
             f"(--max-batch {given} is capped; the mode wins)")
    return {
        "mode": mode,
        "max_batch": config.max_batch,
        "memory_limit": parse_memory_limit(getattr(args, "memory_limit", None)),
    }


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """``--prompts`` and ``--output`` (``--num-return-sequences`` is a decoding flag of
    ``generate``; with ``--prompts`` it means independent replies per prompt)."""
    g = p.add_argument_group("batch")
    g.add_argument("--prompts", default=None, metavar="FILE",
                   help="run every prompt of FILE through the batcher (one a line, or JSONL "
                        "with 'prompt' or 'messages' and per-prompt options); with "
                        "--num-return-sequences N, N independent replies each")
    g.add_argument("--output", "-o", default=None, metavar="FILE",
                   help="with --prompts: JSONL results, written as they finish; a rerun with the same "
                        "settings resumes (default: FILE.results.jsonl; '-' = stdout, no resume)")
    g.add_argument("--redo", action="store_true",
                   help="with --prompts: make again the rows of --output made with other settings "
                        "(without it, such rows are refused)")


# ------------------------------------------------------------------- files
def read_prompts(path: Path) -> list[PromptSpec]:
    """Parse a prompts file: plain lines, or JSON objects with ``prompt``/``messages``.

    Raises:
        OptionError: an unreadable file, a bad JSON line or an invalid option value,
            naming the line.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise OptionError(f"cannot read prompts file {str(path)!r}: {e.strerror or e}") from None
    specs: list[PromptSpec] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            specs.append(PromptSpec(len(specs), line))
            continue
        where = f"{path.name} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise OptionError(f"{where}: invalid JSON ({e.msg})") from None
        prompt = obj.pop("prompt", None) or obj.pop("messages", None)
        if not isinstance(prompt, (str, list)) or not prompt:
            raise OptionError(f"{where}: needs a non-empty 'prompt' or 'messages', got {line[:60]!r}")
        obj.pop("id", None)
        try:
            GenerationOptions().merged(**{k: v for k, v in obj.items() if k != _PER_REQUEST})
        except OptionError as e:
            raise OptionError(f"{where}: {e}") from None
        specs.append(PromptSpec(len(specs), prompt, obj))
    return specs


def request_settings(spec: PromptSpec, sequence: int, defaults: dict[str, Any], *, raw: bool = False,
                     system: str | None = None, model: str | None = None,
                     cascade: dict[str, Any] | None = None, weights: str | None = None) -> dict[str, Any]:
    """What one result row is made with: its generation options (the file's defaults
    under the line's own), the system prompt, raw mode, the model and the cascade flags
    when given. Stored with the row, so a rerun with other settings is told rather than
    silently mixed.

    Args:
        spec: the prompt.
        sequence: which of its replies (a seeded request gets ``seed + sequence``).
        defaults: options from the command line.
        raw, system, model: as given to the command.
        cascade: ``Engine.load``'s cascade keywords, as ``cascade_kwargs`` makes them: the
            cascade forced on (its flags, ``--window`` ...) is stored as ``cascade``, the flags
            shaping ``auto`` as ``cascade_settings``; ``auto`` alone or off is not stored, so
            rows made before stay valid.
        weights: ``--weights`` (the format the weights run in: float32, quantized ...); ``auto``
            or None is not stored, as for ``cascade``.
    """
    opts = {**defaults, **{k: v for k, v in spec.options.items() if k != _PER_REQUEST}}
    if sequence and opts.get("seed") is not None:
        opts["seed"] = opts["seed"] + sequence
    settings = {"options": opts, "system": system, "raw": raw, "model": model}
    cascade = cascade or {}
    if isinstance(cascade.get("cascade"), dict):
        settings["cascade"] = cascade["cascade"]
    if cascade.get("cascade_settings"):
        settings["cascade_settings"] = cascade["cascade_settings"]
    if weights not in (None, "auto"):
        settings["weights"] = weights
    return json.loads(json.dumps(settings))  # as it reads back from the file (tuples -> lists)


def finished_sequences(
    output: Path,
    specs: list[PromptSpec],
    settings_of: Callable[[PromptSpec, int], dict] | None = None,
    *,
    redo: bool = False,
) -> set[tuple[int, int]]:
    """(index, sequence) pairs already in ``output`` with the same settings; a torn last
    line is dropped.

    Args:
        output: the results file.
        specs: the prompts.
        settings_of: the settings a row should have been made with (``request_settings``);
            None skips the check.
        redo: drop rows made with other settings from the file (they run again)
            instead of refusing.

    Raises:
        OptionError: the file holds results of other prompts, or rows made with other
            settings (how many, the first difference, and how to redo them).
    """
    if not output.exists():
        return set()
    done: set[tuple[int, int]] = set()
    text = output.read_text(encoding="utf-8")
    kept: list[str] = []
    differ: list[tuple[tuple[int, int], str]] = []
    good = 0  # bytes of complete lines, so a torn last line can be cut off
    for n, line in enumerate(text.splitlines(keepends=True), start=1):
        if not line.endswith("\n"):
            break  # torn by an interruption mid-write
        try:
            row = json.loads(line)
            key = (int(row["index"]), int(row["sequence"]))
        except (ValueError, KeyError, TypeError):
            raise OptionError(f"{str(output)!r} line {n} is not a results line: choose another --output") from None
        if key[0] >= len(specs) or row.get("prompt") != specs[key[0]].prompt:
            raise OptionError(
                f"{str(output)!r} holds results for other prompts (prompt {key[0]} differs): "
                "choose another --output"
            )
        good += len(line.encode("utf-8"))
        if settings_of is not None:
            want = settings_of(specs[key[0]], key[1])
            if row.get("settings") != want:
                differ.append((key, _difference(row.get("settings"), want)))
                continue
        done.add(key)
        kept.append(line)
    if differ and not redo:
        (index, seq), why = differ[0]
        raise OptionError(
            f"{len(differ)} of {len(differ) + len(done)} finished rows in {str(output)!r} were made with other "
            f"settings (prompt {index}, reply {seq}: {why}): rerun with --redo to make them again, "
            "or choose another --output"
        )
    if differ:  # --redo: keep the matching rows only; the others run again
        from mlotspark.storage import atomic_write

        atomic_write(output, "".join(kept).encode("utf-8"))
    elif good != len(text.encode("utf-8")):
        with output.open("r+b") as f:
            f.truncate(good)
    return done


def _difference(had: Any, want: dict) -> str:
    """The first setting that differs, as ``temperature 0.7 -> 0.2``."""
    if not isinstance(had, dict):
        return "made before settings were stored with each row"
    for key in ("model", "system", "raw", "cascade", "cascade_settings", "weights"):
        if had.get(key) != want.get(key):
            return f"{key} {had.get(key)!r} -> {want.get(key)!r}"
    old, new = had.get("options") or {}, want["options"]
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            return f"{k} {old.get(k, 'default')!r} -> {new.get(k, 'default')!r}"
    return "other settings"


def run_prompts_file(
    engine: Any,
    prompts: Path,
    output: Path | None,
    *,
    raw: bool = False,
    system: str | None = None,
    num_return_sequences: int = 1,
    options: dict[str, Any] | None = None,
    progress: bool = True,
    model: str | None = None,
    redo: bool = False,
    cascade: dict[str, Any] | None = None,
    weights: str | None = None,
) -> int:
    """Run a prompts file through ``engine``, appending JSONL results as they finish.

    Each row stores the settings it was made with (``request_settings``); a rerun
    skips rows made with the same settings and refuses rows made with others
    (``redo`` makes those again), saying on stderr how many it skipped.

    Args:
        engine: a loaded Engine.
        prompts: the prompts file.
        output: the results file (None: stdout, no resume).
        raw: no chat template.
        system: a system prompt for string prompts (chat mode).
        num_return_sequences: replies per prompt.
        options: default options; a line's own options override them.
        progress: a progress bar on stderr.
        model: the model as the user named it (stored with each row).
        redo: make rows with other settings again instead of refusing.
        cascade: the cascade keywords the engine was loaded with (stored with each row).
        weights: the ``--weights`` it was loaded with (stored with each row).

    Returns:
        Sequences finished in this run (those found in ``output`` are skipped).

    Raises:
        OptionError: ``output`` holds other prompts' results, or rows made with other
            settings (without ``redo``).
    """
    specs = read_prompts(prompts)
    defaults = {k: v for k, v in (options or {}).items() if k != _PER_REQUEST}

    def settings(spec: PromptSpec, j: int) -> dict:
        return request_settings(spec, j, defaults, raw=raw, system=system, model=model, cascade=cascade,
                                weights=weights)

    done = finished_sequences(output, specs, settings, redo=redo) if output is not None else set()
    if done:
        print(f"mlotspark: {len(done)} rows already in {output} with the same settings: skipped",
              file=sys.stderr)

    def replies(s: PromptSpec) -> int:
        n = s.options.get(_PER_REQUEST, num_return_sequences)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise OptionError(f"prompt {s.index}: invalid {_PER_REQUEST} {n!r}: must be an integer >= 1")
        return n

    todo = [(s, j) for s in specs for j in range(replies(s)) if (s.index, j) not in done]
    finished: queue.SimpleQueue = queue.SimpleQueue()
    handles = []
    for spec, j in todo:
        opts = settings(spec, j)["options"]
        prompt: Any = spec.prompt
        if system and isinstance(prompt, str) and not raw:
            prompt = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        handles.append(engine.submit(prompt, raw=raw and isinstance(prompt, str),
                                     on_finish=lambda g, s=spec, j=j: finished.put((s, j, g)),
                                     **opts))
    bar = _progress(len(todo) + len(done), len(done), progress)
    sink: Any = output.open("a", encoding="utf-8") if output is not None else nullcontext(sys.stdout)
    written = 0
    try:
        with sink as out, bar:
            while written < len(handles):
                try:
                    spec, j, gen = finished.get(timeout=0.5)
                except queue.Empty:
                    for h in handles:  # a failed request never calls on_finish
                        if h.done:
                            h.result()  # raises its error
                    continue
                _write(out, spec, j, gen, settings(spec, j))
                written += 1
                bar.update(1)
    finally:
        for h in handles:  # interrupted or failed: stop what is still queued or running
            if not h.done:
                h.cancel()
    return written


def _write(out: IO[str], spec: PromptSpec, sequence: int, gen: Any, settings: dict) -> None:
    r = gen.result
    row = {"index": spec.index, "sequence": sequence, "prompt": spec.prompt, "settings": settings}
    if r is not None:
        row.update(text=r.text, **{k: v for k, v in r.stats.to_dict().items() if k != "extra"})
    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    out.flush()  # a finished line survives an interruption


class _NoBar:
    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, initial=initial, unit="seq", file=sys.stderr, dynamic_ncols=True)


# ---------------------------------------------------------------- command
def run(args: argparse.Namespace, options: dict[str, Any], cascade: dict[str, Any],
        load_engine: Callable[[argparse.Namespace, Any], Any]) -> int:
    """``generate --prompts``: load the engine, run the file, report where results went.

    Args:
        args: the parsed ``generate`` flags.
        options: generation options from the flags.
        cascade: ``Engine.load``'s cascade keywords from the flags (``common.cascade_kwargs``).
        load_engine: ``generate.load_engine`` (loads with a status line on a terminal).
    """
    prompts = Path(args.prompts)
    specs = read_prompts(prompts)  # a bad file fails before the model loads
    if not specs:
        raise OptionError(f"prompts file {str(prompts)!r} has no prompts")
    replies = options.pop(_PER_REQUEST, 1)
    output: Path | None
    if args.output == "-":
        output = None
    else:
        output = Path(args.output) if args.output else prompts.with_suffix(".results.jsonl")
        # Other prompts' results, or rows made with other settings, fail now, not after loading.
        finished_sequences(output, specs, None if args.redo else functools.partial(
            request_settings, defaults=options, raw=args.raw, system=args.system, model=args.model,
            cascade=cascade, weights=getattr(args, "weights", None)))
    engine = load_engine(args, cascade)
    try:
        n = run_prompts_file(engine, prompts, output, raw=args.raw, system=args.system,
                             num_return_sequences=replies, options=options,
                             progress=sys.stderr.isatty(), model=args.model, redo=args.redo, cascade=cascade,
                             weights=getattr(args, "weights", None))
    finally:
        engine.close()
    if output is not None:
        print(f"{n} sequences written to {output}", file=sys.stderr)
    return 0
