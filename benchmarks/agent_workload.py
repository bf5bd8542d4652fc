"""Agent workload vs mlx_lm.server (no suite: tools, a ~6k-token system prompt and whole histories resent, turn by turn).

What a coding agent sends: a long system prompt (``--system-tokens``, default ~6k tokens of
natural text: agent instructions, then reference notes drawn from Python's own documentation,
a different stretch for every repetition) with 8 tools, then ``--turns`` (default 10) user
turns, each request resending the whole history (system + every earlier user, assistant and
tool message + the new user message). Replies are greedy and capped at ``--max-tokens``
(default 64); an assistant tool call goes back into the history as the agent would send it,
followed by a canned ``tool`` result. The client is the ``openai`` SDK, streaming.

Per request: TTFT (to the first streamed content or tool-call delta: a reply that opens with a
tool call streams it, on both servers, once the call is whole, so such a turn's TTFT is nearly its
whole reply; each turn records its tool calls), completion tokens (the stream's ``usage``), the
prompt tokens the server took from its cache, and wall time. Per model and repetition the two servers run the same
conversation one after the other, their order alternating, so drift in load hits both.

- *cold* TTFT: turn 1, whose system prompt neither server has seen (each repetition draws
  new notes), on servers already warmed by one short unrelated request, so it is the full
  prefill of the ~6k-token prompt and nothing else. With ``--fresh-server`` both servers
  are restarted before every repetition (fresh ``MLOTSPARK_HOME``), and cold is the very
  first request of a fresh server.
- *warm* TTFT: turns 2..N (the history resent; only its new tail needs prefill); the median
  over those turns.
- aggregate tok/s: completion tokens of the whole conversation / its wall time.

Targets: our warm TTFT <= 5% of our cold TTFT; our aggregate tok/s >= 1.2x
mlx_lm.server's. Each server runs in its own best configuration: ours in performance mode
with its prompt cache; mlx_lm.server with its defaults (its prompt cache included) and its
own BLAS threads (never ``OPENBLAS_NUM_THREADS=1``); see ``mlotspark.bench.serve.start_servers``.

Tools go to models whose chat template takes them (Qwen2.5-Coder); SmolLM2-135M runs the
same workload without tools (its template has none).

Full run (about 40-60 min on the 2-core CPU VM: Qwen prefill ~100 tok/s, decode ~13 tok/s;
the script prints its own estimate first):

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/agent_workload.py \\
        --json agent_workload.json --md agent_workload.md

Smoke run (not a figure): ``--models smollm2-135m-instruct --system-tokens 600 --turns 2 --reps 1``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlotspark.bench.serve import chat, start_servers, stop, write_mlx_lm_dir  # noqa: E402

from mlotspark.bench.ruler import haystack_sentences  # noqa: E402

MODELS = ["qwen2.5-coder-0.5b", "smollm2-135m-instruct"]
SERVERS = ("mlotspark", "mlx_lm.server")
TARGET_WARM_SHARE = 0.05
TARGET_RATIO = 1.2


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S = {"type": "string"}
TOOLS = [
    _fn("read_file", "Read a file of the repository and return its text.",
        {"path": {**S, "description": "path relative to the repository root"},
         "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, ["path"]),
    _fn("write_file", "Replace the whole content of a file (created when missing).",
        {"path": S, "content": S}, ["path", "content"]),
    _fn("edit_file", "Replace one exact occurrence of old_text by new_text in a file.",
        {"path": S, "old_text": S, "new_text": S}, ["path", "old_text", "new_text"]),
    _fn("list_directory", "List the entries of a directory of the repository.",
        {"path": S, "recursive": {"type": "boolean"}}, ["path"]),
    _fn("search_code", "Search the repository for a regular expression; returns matching lines.",
        {"pattern": S, "glob": {**S, "description": "only files matching this glob"}}, ["pattern"]),
    _fn("run_tests", "Run the test suite, or the tests matching an expression.",
        {"selector": S, "timeout_s": {"type": "integer", "minimum": 1}}, []),
    _fn("run_shell", "Run a shell command in the repository and return its output.",
        {"command": S, "cwd": S}, ["command"]),
    _fn("git", "Run a read-only git subcommand (status, diff, log, show).",
        {"subcommand": {"type": "string", "enum": ["status", "diff", "log", "show"]}, "args": S}, ["subcommand"]),
]

PREAMBLE = """You are a careful software engineering agent working inside a Python repository on behalf of
a developer. You can read and change files, search the code, run the tests and run shell commands
through the tools you are given. Work in small steps: look before you change anything, prefer the
smallest change that solves the problem, and run the relevant tests after every change. When a tool
fails, read its error and try a different approach instead of repeating the same call. Never invent
the content of a file you have not read. Keep your answers short: say what you did, what you found
and what you will do next. When you are unsure what the developer wants, ask one precise question.
Follow the conventions of the repository: its formatting, its naming, its error handling and the
structure of its tests. Do not add dependencies without asking. Do not touch files outside the
repository. The developer may interrupt you at any time with a new instruction; the newest
instruction wins. Below are reference notes about the Python language that the developer collected
for this project; use them when they are relevant and ignore them otherwise.

Reference notes:
"""

USER_TURNS = [
    "The test suite fails on test_parse_dates with a ValueError. Find where dates are parsed.",
    "Show me the function that formats the error message, and explain what it does.",
    "Is the timezone handled anywhere? Search for it.",
    "Make the parser accept ISO 8601 dates with a trailing Z. Keep the change small.",
    "Now run the tests that cover date parsing.",
    "One test still fails: it expects naive datetimes to stay naive. Fix that case too.",
    "What does git diff show now? Summarise the change in two sentences.",
    "Add a test for a date with a numeric offset such as +02:00.",
    "Run the whole test suite once more and tell me whether anything else broke.",
    "Write a one-line commit message for this change.",
]

TOOL_RESULT = ("def parse_date(text):\n    \"\"\"Parse a date of the config file.\"\"\"\n"
               "    return datetime.strptime(text, '%Y-%m-%dT%H:%M:%S')\n")


def system_prompt(tokenizer, n_tokens: int, seed: int) -> tuple[str, int]:
    """The agent's system prompt: the preamble, then consecutive paragraphs of notes from a
    start chosen by ``seed``, until it is ``n_tokens`` tokens long (by ``tokenizer``).

    Returns:
        ``(text, tokens)``.
    """
    paragraphs = haystack_sentences()
    start = (seed * 7919) % len(paragraphs)
    parts, used = [PREAMBLE], len(tokenizer.encode(PREAMBLE))
    i = start
    while used < n_tokens:
        para = " ".join(paragraphs[i % len(paragraphs)])
        parts.append(para + "\n\n")
        used += len(tokenizer.encode(para + "\n\n"))
        i += 1
    return "".join(parts), used


def stream_turn(client: OpenAI, model: str, messages: list[dict], tools: list[dict] | None,
                max_tokens: int, tool_options: dict | None = None) -> dict:
    """One streamed request: TTFT, completion tokens, wall time, and the assistant message
    (``tool_options``: ``tool_choice``, ``parallel_tool_calls``, sent with the tools)."""
    kwargs: dict = {"tools": tools, **(tool_options or {})} if tools else {}
    t0 = time.perf_counter()
    first = None
    content, calls, usage, chunks = [], {}, None, 0
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0.0,
                                            stream=True, stream_options={"include_usage": True}, **kwargs)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content or delta.tool_calls:
            chunks += 1
            if first is None:
                first = time.perf_counter() - t0
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or ():
            c = calls.setdefault(tc.index if tc.index is not None else len(calls), {"id": None, "name": "", "args": ""})
            c["id"] = tc.id or c["id"]
            if tc.function is not None:
                c["name"] += tc.function.name or ""
                c["args"] += tc.function.arguments or ""
    wall = time.perf_counter() - t0
    message: dict = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [{"id": c["id"] or f"call_{i}", "type": "function",
                                  "function": {"name": c["name"], "arguments": c["args"] or "{}"}}
                                 for i, c in sorted(calls.items())]
    return {"ttft_s": first if first is not None else wall, "wall_s": wall,
            "completion_tokens": usage.completion_tokens if usage is not None else chunks,
            "prompt_tokens": usage.prompt_tokens if usage is not None else None,
            "cached_tokens": _cached(usage),
            "tool_calls": len(calls), "message": message}


def _cached(usage) -> int | None:
    """Prompt tokens the server took from its cache (both servers report it)."""
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return getattr(details, "cached_tokens", None) if details is not None else None


def conversation(url: str, model: str, system: str, turns: int, tools: list[dict] | None, max_tokens: int,
                 label: str, tool_options: dict | None = None) -> dict:
    """One agent session: ``turns`` requests, each resending the whole history (``tool_options``
    as OpenAI's ``tool_choice`` / ``parallel_tool_calls``; none = the servers' defaults)."""
    client = OpenAI(base_url=url + "/v1", api_key="none", timeout=3600, max_retries=0)
    messages: list[dict] = [{"role": "system", "content": system}]
    records = []
    t0 = time.perf_counter()
    for t in range(turns):
        user = USER_TURNS[t % len(USER_TURNS)] + (f" (round {t // len(USER_TURNS) + 1})" if t >= len(USER_TURNS) else "")
        messages.append({"role": "user", "content": user})
        r = stream_turn(client, model, messages, tools, max_tokens, tool_options)
        messages.append(r.pop("message"))
        for call in messages[-1].get("tool_calls", ()):  # the agent ran the tool: its result follows
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT})
        records.append(r)
        print(f"  {label} turn {t + 1:2d}: TTFT {r['ttft_s']:7.3f} s  {r['completion_tokens']:3d} tokens "
              f"in {r['wall_s']:6.1f} s  prompt {r['prompt_tokens']} ({r['cached_tokens']} cached)  "
              f"tool calls {r['tool_calls']}", flush=True)
    wall = time.perf_counter() - t0
    tokens = sum(r["completion_tokens"] for r in records)
    return {"turns": records, "wall_s": wall, "completion_tokens": tokens, "tps": tokens / wall}


def takes_tools(tokenizer) -> bool:
    """Whether the model's chat template renders ``tools``."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def estimate_s(args: argparse.Namespace, models: list[str]) -> float:
    """Rough wall time of the run, from the prefill and decode rates given."""
    per_turn_new = 120 + args.max_tokens  # user message + tool result + the reply resent
    conv = (args.system_tokens + 900) / args.est_prefill_tps  # cold: the prompt and the tools' schemas
    conv += args.turns * (per_turn_new / args.est_prefill_tps + args.max_tokens / args.est_decode_tps)
    return len(models) * (60 + args.reps * len(SERVERS) * conv)


def summarise(name: str, runs: dict[str, list[dict]], tools: bool) -> dict:
    """Medians per turn and the cold/warm/throughput figures of one model."""
    out: dict = {"tools": tools, "servers": {}}
    for server, convs in runs.items():
        turns = len(convs[0]["turns"])
        per_turn = [statistics.median(c["turns"][t]["ttft_s"] for c in convs) for t in range(turns)]
        cold = per_turn[0]
        warm = statistics.median(per_turn[1:]) if turns > 1 else float("nan")
        out["servers"][server] = {
            "ttft_per_turn_s": per_turn, "cold_ttft_s": cold, "warm_ttft_s": warm, "warm_over_cold": warm / cold,
            "tps": statistics.median(c["tps"] for c in convs),
            "prompt_tokens_per_turn": [convs[0]["turns"][t]["prompt_tokens"] for t in range(turns)],
            "cached_tokens_per_turn": [convs[0]["turns"][t]["cached_tokens"] for t in range(turns)],
            "tool_calls": sum(r["tool_calls"] for c in convs for r in c["turns"]),
        }
    ratios = [a["tps"] / b["tps"] for a, b in zip(runs["mlotspark"], runs["mlx_lm.server"])]
    out["tps_ratio"] = {"median": statistics.median(ratios), "runs": ratios}
    return out


def markdown(results: dict, command: str, args: argparse.Namespace) -> str:
    lines = ["# Agent workload: mlotspark serve vs mlx_lm.server", "",
             f"    {command}", "",
             f"~{args.system_tokens}-token system prompt, {args.turns} turns resent in full, replies <= "
             f"{args.max_tokens} tokens, greedy, {args.reps} repetition(s), medians; cold = turn 1 "
             f"({'first request of a fresh server' if args.fresh_server else 'a system prompt the server has not seen, on a warmed server'}); "
             f"warm = median of turns 2..{args.turns}.", ""]
    for model, r in results.items():
        a, b = r["servers"]["mlotspark"], r["servers"]["mlx_lm.server"]
        q = r["tps_ratio"]
        lines += [f"## {model} ({'8 tools' if r['tools'] else 'no tools'})", "",
                  "| server | TTFT cold | TTFT warm | warm / cold | aggregate tok/s | tool calls |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, s in (("mlotspark", a), ("mlx_lm.server", b)):
            lines.append(f"| {name} | {s['cold_ttft_s']:.3f} s | {s['warm_ttft_s']:.3f} s | "
                         f"{s['warm_over_cold']:.3f} | {s['tps']:.2f} | {s['tool_calls']} |")
        ok_warm = a["warm_over_cold"] <= TARGET_WARM_SHARE
        ok_tps = q["median"] >= TARGET_RATIO
        lines += ["", f"- our warm / cold TTFT: {a['warm_over_cold']:.3f} (target <= {TARGET_WARM_SHARE}: "
                      f"{'met' if ok_warm else 'NOT met'})",
                  f"- aggregate tok/s ratio: {q['median']:.2f}x ({min(q['runs']):.2f}-{max(q['runs']):.2f}) "
                  f"(target >= {TARGET_RATIO}x: {'met' if ok_tps else 'NOT met'})",
                  f"- warm TTFT ratio (mlx_lm.server / ours): {b['warm_ttft_s'] / a['warm_ttft_s']:.2f}x", "",
                  "| turn | prompt tokens | mlotspark TTFT (cached tokens) | mlx_lm.server TTFT (cached tokens) |",
                  "|---:|---:|---:|---:|"]
        for t, (x, y) in enumerate(zip(a["ttft_per_turn_s"], b["ttft_per_turn_s"])):
            lines.append(f"| {t + 1} | {a['prompt_tokens_per_turn'][t]} | {x:.3f} s ({a['cached_tokens_per_turn'][t]}) | "
                         f"{y:.3f} s ({b['cached_tokens_per_turn'][t]}) |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS, help=f"aliases or GGUF paths (default {' '.join(MODELS)})")
    ap.add_argument("--system-tokens", type=int, default=6000, help="system prompt length in tokens (default 6000)")
    ap.add_argument("--turns", type=int, default=10, help="user turns per conversation (default 10)")
    ap.add_argument("--max-tokens", type=int, default=64, help="reply cap (default 64)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per model and server (default 3)")
    ap.add_argument("--no-tools", action="store_true", help="send no tools, whatever the template takes")
    ap.add_argument("--fresh-server", action="store_true",
                    help="restart both servers before every repetition (cold = a fresh server's first request)")
    ap.add_argument("--est-prefill-tps", type=float, default=100.0, help="for the time estimate (default 100)")
    ap.add_argument("--est-decode-tps", type=float, default=5.0, help="for the time estimate (default 5)")
    ap.add_argument("--json", default=None, help="write every record here")
    ap.add_argument("--md", default=None, help="write the markdown summary here (also printed)")
    args = ap.parse_args()
    if args.turns < 1 or args.reps < 1 or args.system_tokens < 0:
        ap.error("--turns and --reps must be >= 1, --system-tokens >= 0")
    command = "flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/agent_workload.py " + shlex.join(sys.argv[1:])
    print(f"estimated wall time: ~{estimate_s(args, args.models) / 60:.0f} min (prefill ~{args.est_prefill_tps:g} tok/s, "
          f"decode ~{args.est_decode_tps:g} tok/s; the smaller model runs faster)", flush=True)

    from transformers import AutoTokenizer

    results: dict = {}
    raw: dict = {}
    for m in args.models:
        work = Path(tempfile.mkdtemp(prefix="agent-bench-"))
        procs: list[subprocess.Popen] = []
        try:
            mlx_dir = write_mlx_lm_dir(m, Path(tempfile.mkdtemp(dir=work)))
            tokenizer = AutoTokenizer.from_pretrained(str(mlx_dir))
            tools = None if args.no_tools or not takes_tools(tokenizer) else TOOLS
            print(f"{m}: {'8 tools' if tools else 'no tools'}", flush=True)
            servers: dict = {}
            runs: dict[str, list[dict]] = {s: [] for s in SERVERS}
            for rep in range(args.reps):
                if args.fresh_server or not servers:
                    stop(procs)
                    home = work / f"rep{rep}"
                    home.mkdir()
                    servers = start_servers(m, home, procs, max_batch=8, mlx_dir=mlx_dir)
                    if not args.fresh_server:  # first-request costs out of the figures; cold = an unseen prompt
                        for url, model in servers.values():
                            chat(url, model, [{"role": "user", "content": "Hello"}], 4)
                system, n = system_prompt(tokenizer, args.system_tokens, seed=rep + 1)
                order = SERVERS if rep % 2 == 0 else tuple(reversed(SERVERS))
                for name in order:
                    url, model = servers[name]
                    print(f"{m} rep {rep + 1}/{args.reps} {name} (system prompt {n} tokens)", flush=True)
                    runs[name].append(conversation(url, model, system, args.turns, tools, args.max_tokens, name))
                    c = runs[name][-1]
                    print(f"  {name}: {c['completion_tokens']} tokens in {c['wall_s']:.1f} s = {c['tps']:.2f} tok/s",
                          flush=True)
            results[m] = summarise(m, runs, tools is not None)
            raw[m] = runs
        finally:
            stop(procs)
            shutil.rmtree(work, ignore_errors=True)

    text = markdown(results, command, args)
    print("\n" + text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "args": vars(args), "summary": results,
                                               "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
