"""``mlotspark memory list|search|add|forget|export|import|reindex``: the semantic memory store.

No chat model is loaded: the store lives in ``$MLOTSPARK_HOME/memory/semantic.db``
and its vectors come from all-mpnet-base-v2 or all-MiniLM-L6-v2 when pulled, else
from the hashing embedder (``models/embedders.py``). Only actions that compare
meanings (search, add, import, reindex) load the embedder; list, forget and export
never touch MLX. ``list`` shows superseded entries too, marked with the entry that
replaced them and when.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from mlotspark.cli.common import positive_int
from mlotspark.errors import OptionError
from mlotspark.memory.semantic.requests import forget_request
from mlotspark.memory.semantic.dates import occurrences


def _entry_dict(e: Any) -> dict:
    return {"id": e.id, "text": e.text, "source": e.source, "conversation": e.conversation, "created": e.created,
            "meta": e.meta, "superseded_by": e.superseded_by, "superseded": e.superseded}


def _when(t: float | None) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"
    except (OverflowError, OSError, ValueError):  # a time no calendar shows (written before imports checked it)
        return "?"


def _line(e: Any, score: float | None = None, successor_forgotten: bool = False) -> str:
    head = f"{e.id:>5}  {_when(e.created)}  {e.source:<6}"
    text = " ⏎ ".join(e.text.splitlines())  # one row an entry: a multi-line one read as rows without ids
    line = f"{head}  {score:.2f}  {text}" if score is not None else f"{head}  {text}"
    said = occurrences(e)
    if len(said) > 1:  # told again on other days (semantic/dates.py)
        line += f"  [said on {len(said)} days, last {_when(said[-1])}]"
    if e.superseded_by is not None:
        # A request to forget keeps the values it replaced superseded: their successor is gone.
        by = "an entry forgotten since" if successor_forgotten else f"#{e.superseded_by}"
        line += f"  [superseded by {by} on {_when(e.superseded)}]"
    return line


_EMBEDDING_ACTIONS = ("search", "add", "import", "reindex")


def forget(store: Any, ids: list[int]) -> None:
    """Delete entries ``ids``, saying which; refuse them all, deleting nothing, if one is unknown.

    Raises:
        StoreError: an unknown id (named).
    """
    from mlotspark.errors import StoreError

    entries = {i: store.get(i) for i in dict.fromkeys(ids)}
    missing = [str(i) for i, e in entries.items() if e is None]
    if missing:
        raise StoreError(f"no memory entry with id {', '.join(missing)}: nothing deleted")
    for i, e in entries.items():
        older = store.superseded_by(i)  # forgetting an update undoes it: say what is current again
        store.forget(i)
        print(f"forgot #{i}: {e.text}")
        for o in older:
            if o.id not in entries and store.get(o.id) is not None:
                print(f"  #{o.id} is current again: {o.text}")


@contextlib.contextmanager
def _scratch_file() -> Iterator[Path]:
    """A file in a private temporary folder (removed after): ``-`` goes through the store's
    file functions, which check, lock and write atomically."""
    with tempfile.TemporaryDirectory(prefix="mlotspark-memory-") as d:
        yield Path(d) / "memory.json"


def run(args: argparse.Namespace) -> int:
    from mlotspark.cli.progress import StatusLine
    from mlotspark.errors import StoreError
    from mlotspark.memory.semantic import SemanticStore

    action = args.action
    # Re-embedding entries written by another embedder loads MiniLM: only where needed.
    # Its first load is a step of seconds: a status line says so (on a terminal).
    status = StatusLine("") if action in _EMBEDDING_ACTIONS else contextlib.nullcontext()
    # reindex re-embeds itself, so that it counts what it did (opening would do it first, silently).
    with status, SemanticStore(reembed=action in _EMBEDDING_ACTIONS and action != "reindex") as store:
        if action == "list":
            # Current entries; with --history the superseded ones too, marked with what replaced them.
            entries = store.list(limit=args.limit, current_only=not args.history)
            if args.json:
                print(json.dumps([_entry_dict(e) for e in entries], ensure_ascii=False, indent=2))
            else:
                for e in entries:
                    print(_line(e, successor_forgotten=e.superseded_by is not None and store.get(e.superseded_by) is None))
                if not entries:
                    print("(memory is empty)")
        elif action == "search":
            if not args.query.strip():  # the store finds nothing for it; a user typed no query
                raise OptionError(f"invalid query {args.query!r}: use a non-empty text")
            # The top k with their scores, no floor: what is weak shows as a low score, not as nothing.
            hits = store.search(args.query, k=args.k, threshold=0.0)
            if args.json:
                out = [{**_entry_dict(h.entry), "score": h.score} for h in hits]
                print(json.dumps(out, ensure_ascii=False, indent=2))
            else:
                for h in hits:
                    print(_line(h.entry, h.score))
                if not hits:
                    print("(nothing found: memory is empty, or no entry shares a word or a meaning with the query)")
        elif action == "add":
            if forget_request(args.text) is not None:  # "Forget that ..." kept as a fact would be the opposite
                raise OptionError(f"{args.text.strip()!r} asks to forget, it is no fact to remember: "
                                  "find its id with mlotspark memory search, then mlotspark memory forget ID")
            told = store.tell(args.text, source="user")
            if told.new:
                print(f"remembered #{told.id}: {args.text.strip()}")
            else:  # a duplicate: the entry it matched
                existing = store.get(told.id)
                # said again after an update: the newest word on it
                print(f"already remembered as #{told.id}: {existing.text if existing else args.text}"
                      + ("  [current again]" if told.current_again else ""))
            for old in filter(None, map(store.get, told.superseded)):
                print(f"  supersedes #{old.id}: {old.text}")
        elif action == "forget":
            forget(store, args.ids)
        elif action == "export":
            if not args.file.strip():
                raise OptionError(f"invalid file {args.file!r}: name a file, or - for stdout")
            if args.file == "-":  # to stdout, for a pipe: the count goes to stderr
                if sys.stdout is None:  # started with stdout closed (">&-")
                    raise OptionError("cannot export to stdout: it is closed")
                with _scratch_file() as tmp:
                    n = store.export_json(tmp)
                    sys.stdout.write(tmp.read_text(encoding="utf-8"))
                print(f"{n} entries written to stdout", file=sys.stderr)
            else:
                n = store.export_json(Path(args.file))
                print(f"{n} entries written to {args.file}")
        elif action == "import":
            if not args.file.strip():
                raise OptionError(f"invalid file {args.file!r}: name a file, or - for stdin")
            if args.file == "-":  # from stdin: checked and added as a file is
                with _scratch_file() as tmp:
                    tmp.write_text(sys.stdin.read(), encoding="utf-8")
                    try:
                        n = store.import_json(tmp)
                    except StoreError as e:  # name what the user gave, not the scratch file
                        raise StoreError(str(e).replace(str(tmp), "stdin")) from None
                print(f"{n} entries added from stdin")
            else:
                n = store.import_json(Path(args.file))
                print(f"{n} entries added from {args.file}")
        elif action == "reindex":
            n = store.reembed()
            print(f"{n} entries re-embedded with {store.embedder.name}; {len(store)} in the store")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("memory", help="list, search, add, forget, export, import or reindex semantic memory",
                       description="The semantic memory store: what the assistant remembers across conversations, "
                                   "in $MLOTSPARK_HOME/memory/semantic.db. `ACTION --help` says more.",
                       epilog="$MLOTSPARK_EMBEDDER picks the embedder: auto (default: mpnet, else minilm when "
                              "pulled, else hashing), hashing, minilm or mpnet; `mlotspark info` names the one in use.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    a = actions.add_parser("list", help="current entries, newest first (--history: superseded ones too)",
                           description="List the current entries, newest first, with the day each was said; "
                                       "--history adds the superseded ones, marked with what replaced them and when.")
    a.add_argument("--limit", type=positive_int, default=None, help="at most this many (default: all)")
    a.add_argument("--history", action="store_true", help="also the superseded entries, with dates")
    a.add_argument("--json", action="store_true", help="print JSON")

    a = actions.add_parser("search", help="the top k entries for a query, with scores",
                           description="The k entries most relevant to a query, best first, with their scores "
                                       "(no floor: the chat injects only those above its threshold).")
    a.add_argument("query", help="free text")
    a.add_argument("-k", type=positive_int, default=5, help="at most this many hits (default 5)")
    a.add_argument("--json", action="store_true", help="print JSON")

    a = actions.add_parser("add", help="remember a text; says its id (or the id it already has)",
                           description="Remember a text; prints its id (or the id it already has).")
    a.add_argument("text", help="the fact to remember")

    a = actions.add_parser("forget", help="delete entries by id (none if one id is unknown)",
                           description="Delete entries by id; if one id is unknown, nothing is deleted. "
                                       "Forgetting an update makes the entry it superseded current again.")
    a.add_argument("ids", type=int, nargs="+", metavar="ID", help="an entry's id, as list and search show it")

    a = actions.add_parser("export", help="write every entry to a JSON file",
                           description="Write every entry to a JSON file (what import reads).")
    a.add_argument("file", help="the JSON file to write (- for stdout)")

    a = actions.add_parser("import", help="add the entries of a JSON file (from export, or a list of strings)",
                           description="Add the entries of a JSON file: one written by export (superseded "
                                       "marks and dates kept), or a JSON list of strings. All or nothing; "
                                       "duplicates are skipped.")
    a.add_argument("file", help="the JSON file to read (- for stdin)")

    actions.add_parser("reindex", help="give every entry a vector from the current embedder "
                       "(after `mlotspark pull all-mpnet-base-v2`, say)",
                       description="Give every entry a vector from the current embedder (`mlotspark info` "
                                   "names it), after `mlotspark pull all-mpnet-base-v2` or all-minilm-l6-v2.")
    p.set_defaults(func=run)
