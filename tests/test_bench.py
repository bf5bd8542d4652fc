"""``mlotspark bench``: every suite runs on a tiny random model, every format parses,
``--compare mlx-lm`` gives a ratio column, and a bad setting is one clear line.

Nothing here asserts a speed: the machine is shared and noisy (DESIGN §7).
"""

from __future__ import annotations

import csv
import io
import json
import re
import struct
import tempfile
import types
import zlib

import pytest

from mlotspark.bench import CSV_COLUMNS, SCHEMA, SUITES, Figure, Report, SuiteError, parse_suites, render
from mlotspark.bench.config import BenchConfig
from mlotspark.bench.context import BenchContext
from mlotspark.bench.plot import encode_png
from mlotspark.bench.progress import Progress
from mlotspark.bench.suites.long import cascade_supported
from mlotspark.cli.entry import main
from mlotspark.errors import OptionError
from mlotspark.platform.device import device_info

from tiny import tiny_model, write_tiny_gguf

SMALL = ["-p", "16", "-g", "4", "-r", "2", "--warmup", "1", "--contexts", "64", "--batch-sizes", "1,2"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", tiny_model())


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_gguf):
    """Every suite, compared with mlx-lm, as JSON and a plot (one run for several tests)."""
    out = tmp_path_factory.mktemp("bench")
    (out / "tmp").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOTSPARK_HOME", str(out / "home"))
        mp.setattr(tempfile, "tempdir", str(out / "tmp"))  # the run's scratch directory goes here
        code = main(["bench", "--model", str(tiny_gguf), *SMALL, "--suite", ",".join(SUITES),
                     "--compare", "mlx-lm", "--format", "json", "--output", str(out / "report.json"),
                     "--plot", str(out / "plot.png"), "--progress", "off"])
    return code, json.loads((out / "report.json").read_text()), (out / "plot.png").read_bytes(), out


@pytest.fixture(autouse=True)
def _scratch_under_tmp_path(tmp_path, monkeypatch):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def bench(capsys, *argv):
    code = main(["bench", *argv, "--progress", "off"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


# -- one run of every suite -------------------------------------------------------------
def test_json_report_has_the_schema_fields(full_run):
    _, doc, _, _ = full_run
    assert doc["schema"] == SCHEMA
    h = doc["header"]
    for key in ("device", "blas", "mlx_version", "mlx_lm_version", "model", "weights", "command",
                "repetitions", "warmup", "prompt_tokens", "gen_tokens"):
        assert h[key] not in (None, ""), key
    assert h["model"] == "tiny" and h["weights"] == "float32" and h["repetitions"] == 2
    for when in ("thermal_start", "thermal_end"):
        assert h[when]["state"] in ("nominal", "fair", "serious", "critical")
    assert doc["results"]
    for r in doc["results"]:
        for key in ("suite", "case", "metric", "unit", "higher_is_better", "median", "min", "max", "n",
                    "values", "mlx_lm", "ratio", "notes"):
            assert key in r, key
        assert r["n"] == 2 and len(r["values"]) == 2 and r["min"] <= r["median"] <= r["max"]


def test_scratch_conversations_are_removed(full_run):
    _, _, _, out = full_run
    assert list((out / "tmp").iterdir()) == []  # conversations and cache files went with the run
    assert not (out / "home" / "conversations").exists() or not any((out / "home" / "conversations").iterdir())


def test_every_suite_runs_or_says_what_it_needs(full_run):
    code, doc, _, _ = full_run
    ran = {r["suite"] for r in doc["results"]}
    missing = {e["suite"]: e["message"] for e in doc["errors"]}
    assert set(SUITES) == ran | set(missing)
    assert {"pp", "tg", "ttft", "batch"} <= ran  # what exists in the engine today
    for suite, message in missing.items():
        assert "needs" in message and "\n" not in message, (suite, message)
    assert code == (1 if any(not e.get("cell") for e in doc["errors"]) else 0)
    if cascade_supported():
        long_rows = [r for r in doc["results"] if r["suite"] == "long"]
        assert any(r["case"].startswith("cascade") for r in long_rows)
        # Prefill beside decode and memory, for every case and length: what a user waits for before the
        # first token; mlx-lm's side too where it ran (the fixture compares).
        prefill = {r["case"]: r for r in long_rows if r["metric"] == "prefill"}
        assert set(prefill) == {r["case"] for r in long_rows}
        for case, r in prefill.items():
            assert r["unit"] == "tok/s" and r["median"] > 0, case
            assert r.get("mlx_lm") is None or r["mlx_lm"]["median"] > 0, case
    else:
        assert "cascade" in missing["long"]


def test_ttft_covers_cold_warm_restored_and_prefix_hit(full_run):
    _, doc, _, _ = full_run
    rows = {(r["case"], r["metric"]): r for r in doc["results"] if r["suite"] == "ttft"}
    for case in ("cold", "warm", "restored", "prefix-hit"):
        assert rows[(case, "TTFT")]["unit"] == "ms"
    for case in ("warm", "restored", "prefix-hit"):
        assert "cache" in rows[(case, "TTFT")]["notes"]
        assert rows[(case, "speed-up vs cold")]["median"] > 0


def test_compare_mlx_lm_gives_ratios(full_run):
    _, doc, _, _ = full_run
    compared = [r for r in doc["results"] if r["mlx_lm"]]
    assert {"pp", "tg", "ttft", "batch"} <= {r["suite"] for r in compared}
    for r in compared:
        assert r["mlx_lm"]["n"] == 2 and r["ratio"] is not None and r["ratio"] > 0


def test_plot_is_a_png(full_run):
    _, doc, png, _ = full_run
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 100 and height > 20 * len(doc["results"])


# -- formats --------------------------------------------------------------------------------
def test_csv_format(capsys, tiny_gguf):
    code, out, err = bench(capsys, "--model", str(tiny_gguf), *SMALL, "--suite", "pp", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert {r["metric"] for r in rows} == {"prefill", "peak memory"}
    assert all(r["case"] == "pp16" and float(r["median"]) > 0 and r["mlx_lm_median"] == "" for r in rows)


def test_table_format_with_ratio_column(capsys, tiny_gguf):
    code, out, err = bench(capsys, "--model", str(tiny_gguf), *SMALL, "--suite", "tg,ttft:cold",
                           "--compare", "mlx-lm")
    assert code == 0, err
    lines = out.splitlines()
    text = "\n".join(lines[:6])
    device = device_info()["device"]  # "cpu" here, "gpu (Metal)" on a Mac, "gpu (CUDA)" on the lent GPU
    for needle in ("tiny", "float32", f"device {device}", "BLAS", "MLX", "mlx-lm", "thermal:", "→"):
        assert needle in text, needle
    table = [ln for ln in lines if ln.startswith("|")]
    assert table[0].split("|")[1:-1] == [" suite ", " case ", " metric ", " mlotspark ", " mlx-lm ", " ratio ", " notes "]
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in table[2:]]
    assert [r[:2] for r in rows] == [["tg", "tg4"], ["tg", "tg4"], ["ttft", "cold"]]
    assert all(r[5].endswith("x") for r in rows)


def test_render_formats_from_a_report():
    f = Figure("pp", "pp16", "prefill", "tok/s", True, [10.0, 12.0, 11.0], [5.0, 6.0, 5.5], "note | pipe")
    report = Report({"model": "m", "compare": "mlx-lm"}, [f], [SuiteError("spec", "spec needs X")])
    table = render(report, "table")
    assert "| pp | pp16 | prefill (tok/s) | 11.00 [10.00–12.00] | 5.50 | 2.00x | note / pipe |" in table
    assert "not run: spec needs X" in table
    doc = json.loads(render(report, "json"))
    assert doc["results"][0]["ratio"] == 2.0 and doc["errors"] == [{"suite": "spec", "message": "spec needs X", "cell": False}]
    with pytest.raises(OptionError, match="'xml'"):
        render(report, "xml")


# -- figures and repetitions -------------------------------------------------------------------
def test_ratio_means_better_whichever_the_unit():
    faster = Figure("tg", "tg", "decode", "tok/s", True, [20.0, 30.0, 40.0], [10.0, 10.0, 10.0])
    assert faster.ratio == 3.0  # median of 2, 3, 4
    sooner = Figure("ttft", "cold", "TTFT", "ms", False, [50.0, 50.0], [100.0, 200.0])
    assert sooner.ratio == 3.0  # median of 2 and 4
    assert Figure("pp", "pp", "prefill", "tok/s", True, [1.0]).ratio is None


def test_measure_interleaves_after_a_warm_up():
    order: list[str] = []
    config = BenchConfig(repetitions=3, warmup=1)
    ctx = BenchContext(None, config, Progress(4, enabled=False), workdir=".")  # type: ignore[arg-type]
    mine, theirs = ctx.measure("x", lambda: order.append("ours") or {"v": 1.0},
                               lambda: order.append("ref") or {"v": 2.0})
    assert order == ["ours", "ref", "ours", "ref", "ref", "ours", "ours", "ref"]
    assert mine == {"v": [1.0] * 3} and theirs == {"v": [2.0] * 3}


def test_progress_bar_draws_steps():
    stream = io.StringIO()
    bar = Progress(4, enabled=True, stream=stream)
    bar.step("pp512 mlotspark 1/5")
    bar.step()
    assert "2/4" in stream.getvalue() and "pp512 mlotspark 1/5" in stream.getvalue()
    assert "[##########" in stream.getvalue()


def test_png_encoder_round_trips():
    import numpy as np

    img = np.zeros((3, 4, 3), dtype=np.uint8)
    img[1, 2] = (255, 0, 7)
    png = encode_png(img)
    idat = png[png.index(b"IDAT") + 4:]
    raw = zlib.decompress(idat[: struct.unpack(">I", png[png.index(b"IDAT") - 4: png.index(b"IDAT")])[0]])
    rows = [raw[i * 13 + 1:(i + 1) * 13] for i in range(3)]
    assert rows[1][6:9] == bytes([255, 0, 7]) and len(raw) == 3 * 13


# -- settings -----------------------------------------------------------------------------
def test_suite_selection_keeps_order_and_cases():
    assert parse_suites("tg,pp") == (("tg", ()), ("pp", ()))
    assert parse_suites("ttft:cold,ttft:warm,pp") == (("ttft", ("cold", "warm")), ("pp", ()))
    assert parse_suites("ttft:cold,ttft") == (("ttft", ()),)
    assert [n for n, _ in parse_suites("all")] == list(SUITES) and parse_suites("pp,all")[0] == ("pp", ())


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--suite", "pp,fast"], "unknown suite 'fast'"),
        (["--suite", "ttft:hot"], "unknown case 'hot' of suite 'ttft'"),
        (["--plot", "chart.jpg"], "'chart.jpg'"),
        (["--batch-sizes", "1,0"], "invalid batch size 0"),
        (["--contexts", "1k"], "invalid context length '1k'"),
        (["--model", "/nowhere/model.gguf"], "/nowhere/model.gguf"),
    ],
)
def test_bad_settings_are_one_line(capsys, argv, needle):
    code, out, err = bench(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("mlotspark: error:") and needle in err[0], err


def test_prompt_longer_than_the_context_is_refused(capsys, tiny_gguf):
    code, _, err = bench(capsys, "--model", str(tiny_gguf), "-p", "600", "--suite", "pp")
    assert code == 2 and len(err) == 1 and "-p 600" in err[0] and "512" in err[0]


def test_zero_repetitions_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "-r", "0"])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("flag, name", [("--output", "report.md"), ("--plot", "chart.png")])
def test_an_unwritable_report_path_is_refused_before_anything_runs(capsys, tmp_path, flag, name):
    """Checked before the model loads (the model here does not exist): a long run's
    figures are not lost to a bad path at the end."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for path in (tmp_path, blocker / name):  # a directory; a file's "subdirectory"
        code, out, err = bench(capsys, "--model", "/nowhere/model.gguf", flag, str(path))
        assert code == 2 and out == "" and len(err) == 1, err
        assert err[0].startswith(f"mlotspark: error: invalid {flag} '{path}'"), err


def test_a_report_that_cannot_be_written_at_the_end_goes_to_stdout(capsys, tmp_path, tiny_gguf, monkeypatch):
    import mlotspark.storage as storage
    from mlotspark.errors import StoreError

    def full_disk(path, data):
        raise StoreError(f"cannot write {path}: No space left on device")

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(storage, "atomic_write", full_disk)
    code, out, err = bench(capsys, "--model", str(tiny_gguf), *SMALL, "--suite", "pp", "--format", "json",
                           "--output", str(tmp_path / "report.json"))
    assert code == 1 and json.loads(out)["results"][0]["suite"] == "pp"
    assert "No space left on device" in err[-1] and "stdout" in err[-1]


def test_the_header_names_the_blas_threads_mlx_lm_ran_at(monkeypatch):
    """In one process mlx-lm shares MLX's OpenBLAS, so it runs at the count our engine
    fitted to the free cores: the report says which count each side ran at (RESULTS.md's
    headline measures the same way), or that the user's OPENBLAS_NUM_THREADS held for both."""
    import importlib

    from mlotspark.bench.runner import blas_threads
    from mlotspark.platform import blas

    class FakeEngine:
        scheduler = types.SimpleNamespace(call=lambda fn, *args: fn(*args))

    def stream_generate(model, tokenizer, prompt, max_tokens, prompt_cache=None):
        yield from [None] * max_tokens

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setattr(importlib.import_module("mlx_lm.generate"), "stream_generate", stream_generate)
    ctx = BenchContext(FakeEngine(), BenchConfig(), Progress(1, enabled=False), workdir=".")  # type: ignore[arg-type]
    ctx._twin, ctx._ref_tokenizer = object(), object()
    for fitted in (2, 1, 1):  # the machine got busy during the run
        monkeypatch.setattr(blas, "_FITTED", fitted)
        assert ctx.mlx_lm([1, 2, 3], 3).tokens == 3
    assert ctx.mlx_lm_threads == {1, 2}
    text = blas_threads(ctx.mlx_lm_threads)
    assert text.startswith("BLAS threads: mlotspark fitted to the free cores (last 1), mlx-lm 1/2 ("), text
    assert "mlx-lm" not in blas_threads(set())
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert blas_threads(ctx.mlx_lm_threads) == "BLAS threads 1 on both sides (OPENBLAS_NUM_THREADS)"


def test_long_runs_the_cascade_on_the_same_engine(tmp_path, tiny_gguf, monkeypatch):
    """One model in memory (a second engine's weights had counted in every row's peak
    memory, full attention's too); the cascade rows ran the cascade, the full rows did not,
    and the engine's own setting is back afterwards."""
    from mlotspark.bench import run_bench
    from mlotspark.engine import Engine

    loads, engines, used = [], [], []
    real_load, real_ours = Engine.load.__func__, BenchContext.ours

    def load(cls, model=None, *, cascade="auto", **k):
        loads.append(cascade)
        engines.append(real_load(cls, model, cascade=cascade, **k))
        return engines[-1]

    def ours(self, ids, max_tokens, **k):
        r = real_ours(self, ids, max_tokens, **k)
        used.append(bool(r.extra.get("cascade")))
        return r

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Engine, "load", classmethod(load))
    monkeypatch.setattr(BenchContext, "ours", ours)
    config = BenchConfig(model=str(tiny_gguf), gen_tokens=4, repetitions=1, warmup=0, contexts=(64,),
                         suites=parse_suites("long"))
    report = run_bench(config, show_progress=False)
    assert len(loads) == 1 and engines[0].caches.cascade == "auto"
    assert not report.errors, report.errors
    assert sorted(used) == [False, True]
    assert {f.case for f in report.figures} == {"full 64", "cascade 64"}


def test_a_model_without_the_cascade_keeps_its_full_attention_cells(capsys, tmp_path, monkeypatch):
    """Gemma 3 runs on mlx-lm's classes, where the cascade cannot run: ruler and long still
    measure full attention, and every cell that could not run is listed with why (both suites
    had failed whole, full attention's figures with them)."""
    from zoo import write_gguf

    gguf = write_gguf(tmp_path / "gemma3.gguf", "gemma3", context=2048)  # its "64-token" RULER prompt takes ~970 tiny tokens
    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path / "home"))
    code, out, err = bench(capsys, "--model", str(gguf), "-g", "4", "-r", "1", "--warmup", "0",
                           "--suite", "ruler:niah_single,long", "--contexts", "64,2100", "--format", "json")
    doc = json.loads(out)
    cases = {(r["suite"], r["case"]) for r in doc["results"]}
    assert cases == {("ruler", "niah_single full 64"), ("long", "full 64")}, cases
    said = [e["message"] for e in doc["errors"]]
    assert any(m.startswith("ruler cascade and sinks + window: ") and "llama-family" in m for m in said), said
    assert any(m.startswith("long cascade: ") for m in said), said
    assert any(m.startswith("ruler niah_single full 2100: ") and "context of 2048" in m for m in said), said
    assert any(m.startswith("long 2100: ") for m in said), said
    assert code == 0, err  # cells not run are listed, no failure: every suite ran what it could


def test_ruler_notes_say_what_each_mode_ran(full_run):
    """sinks + window is the cascade with top-k 0 (its note had said the cascade's top-k),
    and the cascade's rows count the requests whose question pass ran (stats.extra)."""
    _, doc, _, _ = full_run
    rows = {r["case"].split()[1]: r for r in doc["results"] if r["suite"] == "ruler"}
    assert {"cascade", "streaming"} <= set(rows)
    assert "top-k 0 x" in rows["streaming"]["notes"] and "question pass" not in rows["streaming"]["notes"]
    assert re.search(r"question pass in \d+/\d+", rows["cascade"]["notes"]), rows["cascade"]["notes"]


@pytest.mark.parametrize("argv", [["--models-dir", "/m", "bench"], ["bench", "--models-dir", "/m"]])
def test_the_recorded_command_names_the_models_folder(argv):
    """An alias means the model in ``--models-dir``: the report's command line must say which."""
    from mlotspark.cli.entry import build_parser
    from mlotspark.cli.bench import _command

    args = build_parser().parse_args([*argv, "--model", "qwen2.5-coder-0.5b", "--suite", "tg"])
    assert _command(args).startswith("mlotspark bench --models-dir /m --model qwen2.5-coder-0.5b ")
    plain = build_parser().parse_args(["bench", "--suite", "tg"])
    assert "--models-dir" not in _command(plain)


# -- suites that run alone ----------------------------------------------------------------
def test_the_suites_that_run_alone_are_listed(capsys):
    """serve, memory and conformance are suites too: named in --help, refused beside others."""
    from mlotspark.bench.suites import ALONE

    assert {"serve", "memory", "conformance"} <= set(ALONE)
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    for name in ("serve", "memory", "conformance"):
        assert f"{name}: " in help_text
    with pytest.raises(OptionError, match="'conformance' runs alone"):
        parse_suites("pp,conformance")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--suite", "serve", "--clients", "4,0"], "invalid client count 0"),
        (["--suite", "serve", "--clients", "", "--histories", "0"], "nothing to measure"),
        (["--suite", "serve", "--format", "csv"], "--format csv"),
        (["--suite", "serve,pp"], "'serve' runs alone"),
    ],
)
def test_serve_settings_are_refused_in_one_line_before_any_server_starts(capsys, monkeypatch, argv, needle):
    import mlotspark.bench.serve as serve

    monkeypatch.setattr(serve, "start_servers", lambda *a, **k: pytest.fail("a server started"))
    code, out, err = bench(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("mlotspark: error:") and needle in err[0], err


def test_serve_record_has_throughput_ratio_and_ttft_per_server(capsys, tmp_path, monkeypatch):
    """The record's shape, with the servers and their HTTP calls stood in for (no model runs):
    each client count measured on both servers, alternating, the requested number of times."""
    import mlotspark.bench.serve as serve

    calls: list[tuple[str, int]] = []
    urls = {"mlotspark": ("http://ours", "tiny"), "mlx_lm.server": ("http://theirs", "default_model")}
    monkeypatch.setattr(serve, "start_servers", lambda model, work, procs, max_batch=16: dict(urls))
    monkeypatch.setattr(serve, "chat", lambda url, model, messages, max_tokens: {})

    def throughput(url, model, clients, requests, tokens, salt):
        calls.append((url, clients))
        assert requests == 3 and tokens == 5
        tps = 20.0 if url == "http://ours" else 10.0
        return {"rps": 1.0, "tps": tps, "tokens": 10, "wall_s": 1.0}

    monkeypatch.setattr(serve, "throughput", throughput)
    monkeypatch.setattr(serve, "warm_cold", lambda url, model, seed: (2.0, 0.5))
    chained: list[tuple[str, int]] = []

    def chain(url, model, seed, turns):
        chained.append((url, turns))
        return {"cold_s": 4.0, "warm_s": 0.1, "turns_s": [0.1] * turns}

    monkeypatch.setattr(serve, "responses_chain", chain)
    out = tmp_path / "serve.json"
    code, _, err = bench(capsys, "--suite", "serve", "--model", "tiny", "--clients", "2,4", "--requests", "3",
                         "-g", "5", "-r", "2", "--histories", "1", "--format", "json", "--output", str(out))
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["command"].startswith("mlotspark bench --model tiny") and "--suite serve" in record["command"]
    assert "--clients 2,4" in record["command"] and "--histories 1" in record["command"]
    assert record["clients"] == [2, 4] and record["repetitions"] == 2
    assert sorted(record["throughput"]) == ["mlotspark", "mlx_lm.server"]
    for server in record["throughput"].values():
        assert sorted(server) == ["2", "4"] and all(len(c["runs"]) == 2 for c in server.values())
    assert record["ratio"]["2"]["median"] == pytest.approx(2.0)
    assert record["ttft"]["mlotspark"]["cold_s"] == 2.0 and record["ttft"]["mlx_lm.server"]["warm_s"] == 0.5
    assert [u for u, c in calls if c == 2] == ["http://ours", "http://theirs", "http://theirs", "http://ours"]
    assert "| 2 |" in serve.render_markdown(record)  # the tables RESULTS quotes
    assert chained == [("http://ours", 10)] and record["responses"]["warm_s"] == 0.1  # ours alone: theirs has none
    assert "| chain of 11 turns | 4.000 s | 0.100 s | 0.025 |" in serve.render_markdown(record)
