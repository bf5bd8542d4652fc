"""BFCL v4 tool-call evaluation (no suite: needs the `bfcl-eval` wheel's data), our server vs mlx_lm.server.

Tool calls under ``auto`` on public data nobody here wrote: BFCL v4 ``simple_python`` and
``irrelevance`` (the first ``--n`` of each by id), ``mlotspark serve`` beside
``mlx_lm.server`` on the same weights, scored with BFCL's own AST checker.

The data and the checker come from the ``bfcl-eval`` wheel on PyPI, installed without its
dependencies (``pip install --no-deps bfcl-eval``); the checker's module imports every
model handler's SDK only for a table of model names, which is stubbed here with the one
entry the checker reads (``underscore_to_dot``: a dotted name such as ``math.factorial``
is sent as ``math_factorial``, as BFCL does for OpenAI-style function calling).

Each server runs as ``mlotspark.bench.serve.start_servers`` starts it (its own best
configuration); requests go through the ``openai`` SDK, greedy, ``tool_choice`` auto,
one case at a time, the two servers in one run. Per reply:

- ``simple_python``: right when the reply's calls pass BFCL's checker;
- ``irrelevance``: right when the reply makes no call;
- ``lost``: no call came back, but the text holds one (a ``<tool_call>`` tag, a fenced or
  bare ``{"name": ...}`` naming a given function): a call lost as text;
- ``unparsed``: a call whose arguments are not JSON.

Run (about 40 min on the 2-core CPU VM for both servers, ``--n 50``)::

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/bfcl_tools.py --json bfcl.json --md bfcl.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import types
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlotspark.bench.serve import start_servers, stop  # noqa: E402

CATEGORIES = ("simple_python", "irrelevance")
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def _bfcl() -> tuple:
    """BFCL's checker and data folder (``pip install --no-deps bfcl-eval``)."""
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {"mlotspark": types.SimpleNamespace(underscore_to_dot=True)}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    try:
        import bfcl_eval
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    except ImportError as e:
        sys.exit(f"bfcl_tools: needs BFCL's data and checker: pip install --no-deps bfcl-eval ({e})")
    return ast_checker, Language, Path(bfcl_eval.__file__).parent / "data"


def _schema(node: object) -> object:
    """BFCL's parameter types as JSON Schema (dict -> object, float -> number, ...)."""
    if isinstance(node, dict):
        out = {k: _schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str) and out["type"] in _TYPES:
            kind = _TYPES[out["type"]]
            if kind is None:
                out.pop("type")
            else:
                out["type"] = kind
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def tools_of(functions: list[dict]) -> list[dict]:
    return [{"type": "function", "function": {"name": f["name"].replace(".", "_"), "description": f["description"],
                                              "parameters": _schema(f["parameters"])}} for f in functions]


def cases(data: Path, category: str, n: int) -> list[dict]:
    rows = [json.loads(line) for line in (data / f"BFCL_v4_{category}.json").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: int(r["id"].rsplit("_", 1)[1]))
    answers = {}
    path = data / "possible_answer" / f"BFCL_v4_{category}.json"
    if path.exists():
        answers = {r["id"]: r["ground_truth"] for r in map(json.loads, path.read_text().splitlines()) if r}
    return [{**r, "answer": answers.get(r["id"])} for r in rows[:n]]


def lost_call(text: str, names: list[str]) -> bool:
    """The text holds a call of a given function (so the server lost it as text)."""
    if "<tool_call>" in text:
        return True
    for m in re.finditer(r'\{\s*"name"\s*:\s*"([^"]+)"', text):
        if m.group(1) in names:
            return True
    return False


def ask(client: OpenAI, model: str, case: dict, max_tokens: int) -> dict:
    tools = tools_of(case["function"])
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=case["question"][0], tools=tools, tool_choice="auto",
                                       temperature=0.0, max_tokens=max_tokens)
    msg = r.choices[0].message
    calls = []
    unparsed = 0
    for c in msg.tool_calls or []:
        try:
            calls.append({c.function.name: json.loads(c.function.arguments)})
        except ValueError:
            unparsed += 1
    names = [t["function"]["name"] for t in tools]
    return {"id": case["id"], "calls": calls, "unparsed": unparsed, "text": msg.content or "",
            "lost": not calls and lost_call(msg.content or "", names), "s": time.perf_counter() - t0,
            "finish": r.choices[0].finish_reason}


def score(category: str, case: dict, reply: dict, checker, language) -> bool:
    if category == "irrelevance":
        return not reply["calls"] and not reply["unparsed"]
    if not reply["calls"]:
        return False
    out = checker(case["function"], reply["calls"], case["answer"], language.PYTHON, "simple_python", "mlotspark")
    return bool(out["valid"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=50, help="cases per category, the first by id (default 50)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--servers", nargs="+", default=["mlotspark", "mlx_lm.server"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args()
    checker, language, data = _bfcl()
    work = Path(tempfile.mkdtemp(prefix="bfcl-"))
    procs: list = []
    report: dict = {"command": " ".join(sys.argv), "model": args.model, "n": args.n, "servers": {}}
    try:
        servers = start_servers(args.model, work, procs)
        for category in CATEGORIES:
            for case in cases(data, category, args.n):
                for name in args.servers:  # the two servers one after the other, per case
                    url, model = servers[name]
                    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=900, max_retries=0)
                    reply = ask(client, model, case, args.max_tokens)
                    reply["right"] = score(category, case, reply, checker, language)
                    report["servers"].setdefault(name, {}).setdefault(category, []).append(reply)
                    print(f"{name:14} {case['id']:20} right={reply['right']!s:5} calls={len(reply['calls'])} "
                          f"lost={reply['lost']} {reply['s']:.1f}s", file=sys.stderr, flush=True)
    finally:
        stop(procs)
    lines = [f"# BFCL v4 tool calls under auto: {args.model}, first {args.n} of each category", "",
             f"`{report['command']}`", "",
             "| server | category | right | calls lost as text | calls that do not parse |", "|---|---|---|---|---|"]
    for name, cats in report["servers"].items():
        for category, replies in cats.items():
            right = sum(r["right"] for r in replies)
            lost = sum(r["lost"] for r in replies)
            bad = sum(r["unparsed"] for r in replies)
            lines.append(f"| {name} | {category} | {right}/{len(replies)} | {lost} | {bad} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.md:
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
