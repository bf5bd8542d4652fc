"""The memory cascade's flags, the same in ``generate``, ``serve`` and ``chat``:
``--cascade {auto,on,off}`` and the flags that shape it (``cli/common.py``), down to
``Engine.load(cascade=..., cascade_settings=...)`` (``runtime/cache_choice.py``).

On the tiny random model (a 512-token context): a prompt of ``LONG`` tokens is past
it, ``abc`` with 3 new tokens is not.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mlotspark.cli.entry import build_parser, main
from mlotspark.cli.common import cascade_kwargs
from mlotspark.errors import OptionError
from tiny import tiny_model, write_tiny_gguf

COMMANDS = ("generate", "serve", "chat")
LONG = "abcdefgh " * 60  # 540 byte tokens: past the tiny model's 512


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", tiny_model())


def kwargs_for(command: str, *argv: str) -> dict[str, Any]:
    return cascade_kwargs(build_parser().parse_args([command, *argv]))


def one_line_error(capsys, *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("mlotspark: error:"), err
    return err[0]


# -- the flags -> Engine.load's keywords, alike in the three commands -----------------------
CHOICES = [
    ([], {"cascade": "auto"}),
    (["--cascade", "auto"], {"cascade": "auto"}),
    (["--window", "128"], {"cascade": {"window": 128}}),  # a shaping flag alone turns it on
    (["--cascade", "on"], {"cascade": {}}),
    (["--cascade", "on", "--top-k-blocks", "2", "--routing", "token"], {"cascade": {"top_k": 2, "routing": "token"}}),
    (["--cascade", "auto", "--window", "128", "--block-kind", "q8"],
     {"cascade": "auto", "cascade_settings": {"window": 128, "block_kind": "q8"}}),
    (["--cascade", "off"], {"cascade": None}),
    (["--no-cascade"], {"cascade": None}),
    (["--no-cascade", "--cascade", "off"], {"cascade": None}),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("argv, expected", CHOICES, ids=[" ".join(a) or "none" for a, _ in CHOICES])
def test_each_command_turns_the_flags_into_the_same_load_keywords(command, argv, expected):
    assert kwargs_for(command, *argv) == expected


CONFLICTS = [
    (["--cascade", "off", "--window", "64"], ("--cascade off", "--window")),
    (["--no-cascade", "--top-k-blocks", "2"], ("--no-cascade", "--top-k-blocks")),
    (["--no-cascade", "--cascade", "on"], ("--no-cascade", "--cascade on")),
    (["--no-cascade", "--cascade", "auto"], ("--no-cascade", "--cascade auto")),
    (["--cascade", "auto", "--window", "16", "--block-size", "32"], ("block_size 32",)),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("argv, names", CONFLICTS, ids=[" ".join(a) for a, _ in CONFLICTS])
def test_each_command_refuses_a_conflict_or_a_bad_value_in_one_line(capsys, command, argv, names):
    line = one_line_error(capsys, command, *argv)  # before any model loads
    for name in names:
        assert name in line


def test_generate_keeps_its_conflicts_with_the_cascade_forced_on(capsys):
    for argv, forced in ((["--cascade", "on", "--speculative", "prompt_lookup"], "--cascade on"),
                         (["--window", "64", "--speculative", "prompt_lookup"], "--window"),
                         (["--cascade", "on", "--cache-kind", "q8"], "--cascade on"),
                         (["--cascade", "on", "--beams", "2"], "--cascade on"),
                         (["--window", "64", "--num-return-sequences", "2"], "--window")):
        line = one_line_error(capsys, "generate", *argv)
        assert forced in line and argv[2] in line
    # Under auto the cascade takes only a prompt past the context: a short one may still speculate.
    assert kwargs_for("generate", "--cascade", "auto", "--window", "64", "--speculative", "prompt_lookup",
                      "--cache-kind", "q8") == {"cascade": "auto", "cascade_settings": {"window": 64}}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_negative_count_names_its_flag(capsys, command):
    for flag in ("--top-k-blocks", "--sinks"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, flag, "-1"])
        assert f"argument {flag}: must be >= 0" in capsys.readouterr().err


def test_generate_refuses_cascade_auto_across_ranks(capsys):
    line = one_line_error(capsys, "generate", "--distributed", "pipeline", "--cascade", "auto")
    assert "--cascade auto" in line and "--distributed pipeline" in line


# -- the engine's seam: cascade="auto" with cascade_settings -----------------------------------
def test_auto_with_settings_runs_a_long_prompt_through_that_cascade_and_a_short_one_plainly(tiny_gguf):
    from mlotspark.engine import Engine

    engine = Engine.load(str(tiny_gguf), progress=False, cascade="auto",
                         cascade_settings={"window": 128, "top_k": 2})
    try:
        assert engine.caches.cascade == "auto"
        long = engine.generate(LONG, raw=True, max_tokens=2, temperature=0)
        assert long.stats.extra["cache"]["kind"] == "cascade"
        config = long.stats.extra["cascade"]["config"]
        assert (config["window"], config["top_k"]) == (128, 2)
        assert config["sinks"] == 16 and config["block_size"] == 16  # the rest: for_model's for 512
        short = engine.generate("abc", raw=True, max_tokens=3, temperature=0)
        assert short.stats.extra["cache"]["kind"] == "plain" and "cascade" not in short.stats.extra
    finally:
        engine.close()


def test_auto_without_settings_keeps_the_models_defaults(tiny_gguf):
    from mlotspark.engine import Engine
    from mlotspark.memory.cascade import CascadeConfig

    engine = Engine.load(str(tiny_gguf), progress=False)
    try:
        assert engine.caches.cascade_for(len(LONG), engine.defaults) == CascadeConfig.for_model(512)
    finally:
        engine.close()


@pytest.mark.parametrize("kw, needle", [
    ({"cascade_settings": {"windw": 128}}, "unknown cascade option(s): windw"),
    ({"cascade_settings": {"window": 0}}, "invalid cascade window 0"),
    ({"cascade_settings": 128}, "invalid cascade_settings 128"),
    ({"cascade": None, "cascade_settings": {"window": 128}}, "cascade_settings {'window': 128}"),
    ({"cascade": {"window": 64}, "cascade_settings": {"window": 128}}, "not cascade={'window': 64}"),
])
def test_bad_settings_fail_before_the_model_loads(kw, needle):
    from mlotspark.engine import Engine

    with pytest.raises(OptionError) as e:
        Engine.load("./no-such-model.gguf", progress=False, **kw)  # the model is never looked for
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_settings_past_the_models_context_fail_at_load(tiny_gguf):
    from mlotspark.engine import Engine

    with pytest.raises(OptionError, match="exceeds the model's trained context of 512"):
        Engine.load(str(tiny_gguf), progress=False, cascade_settings={"window": 480})


# -- serve: its loader, then over HTTP ------------------------------------------------------------
def _served(tiny_gguf, *flags: str) -> Any:
    from live_server import LiveServer
    from mlotspark.cli import serve

    args = build_parser().parse_args(["serve", "--model", str(tiny_gguf), *flags])
    return LiveServer(serve.engine_loader(args)(args.model[0]))  # the engine `serve` would serve


def _complete(srv: Any, prompt: str) -> dict:
    body = {"model": srv.model, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["mlotspark"]


def test_serve_cascade_on_runs_a_short_request_through_the_cascade_with_its_window(tiny_gguf):
    srv = _served(tiny_gguf, "--cascade", "on", "--window", "128")
    try:
        figures = _complete(srv, "abc")
        assert figures["cascade"]["config"]["window"] == 128
        assert figures["cascade"]["tokens"]["total"] >= 3
    finally:
        srv.stop()


def test_serve_cascade_auto_keeps_a_short_request_plain_and_shapes_a_long_one(tiny_gguf):
    srv = _served(tiny_gguf, "--cascade", "auto", "--window", "128")
    try:
        assert "cascade" not in _complete(srv, "abc")
        assert _complete(srv, LONG)["cascade"]["config"]["window"] == 128
    finally:
        srv.stop()


# -- chat: the TUI's engine is loaded with the chosen cascade -----------------------------------
class _RecordingApp:
    """Stands for ``tui.ChatApp``: loads the engine as the app does on start, then quits."""

    engine: Any = None
    return_code: int | None = 0  # as a Textual app that ended without an error

    def __init__(self, *, model: str | None, loader: Any, **_: Any):
        self.model, self.loader = model, loader

    def run(self) -> None:
        _RecordingApp.engine = self.loader(self.model)

    def close_engine(self) -> None:
        pass  # the test reads the engine, then closes it


@pytest.mark.parametrize("flags, window", [(["--cascade", "on", "--window", "128"], 128),
                                           (["--cascade", "auto", "--window", "96"], 96)])
def test_chat_loads_its_engine_with_the_chosen_cascade(tiny_gguf, monkeypatch, flags, window):
    import tui

    from mlotspark.memory.cascade import CascadeConfig

    monkeypatch.setattr(tui, "ChatApp", _RecordingApp)
    assert main(["chat", "-m", str(tiny_gguf), *flags]) == 0
    engine = _RecordingApp.engine
    try:
        short = engine.defaults.merged(max_tokens=3)
        if flags[1] == "on":
            assert isinstance(engine.caches.cascade, CascadeConfig) and engine.caches.cascade.window == window
            assert engine.caches.cascade_for(3, short).window == window
        else:
            assert engine.caches.cascade == "auto" and engine.caches.cascade_for(3, short) is None
            assert engine.caches.cascade_for(len(LONG), short).window == window
    finally:
        engine.close()


def test_chat_refuses_a_window_past_the_context_before_its_app_starts(tiny_gguf, monkeypatch, capsys):
    import tui

    started = []
    monkeypatch.setattr(tui, "ChatApp", lambda **kw: started.append(kw))
    assert main(["chat", "-m", str(tiny_gguf), "--window", "99999"]) == 2
    err = capsys.readouterr().err
    assert not started and "window 99999" in err and "--window" in err and len(err.strip().splitlines()) == 1


# -- serve's prompt cache holds to the server's cascade -------------------------------------------
def _served_with_cache(tiny_gguf, *flags: str) -> Any:
    from live_server import LiveServer
    from mlotspark.cli import serve
    from mlotspark.server import PromptCache

    args = build_parser().parse_args(["serve", "--model", str(tiny_gguf), *flags])
    engine = serve.engine_loader(args)(args.model[0])
    return LiveServer(engine, prompt_cache=PromptCache(engine, budget_mb=64))


def test_an_exact_repeat_through_the_prompt_cache_still_runs_the_question_pass(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    srv = _served_with_cache(tiny_gguf, "--cascade", "on", "--window", "128")
    try:
        first, again = _complete(srv, LONG), _complete(srv, LONG)
        assert first["cascade"]["question_passes"] == 1
        # The cached prefix stops short of the tail the pass re-reads (question_pass = 64 tokens).
        assert 0 < again["cached_tokens"] <= len(LONG) - 64
        assert again["cascade"]["question_passes"] == 1
    finally:
        srv.stop()


def test_a_restarted_server_uses_no_saved_entry_of_another_cache(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    srv = _served_with_cache(tiny_gguf, "--cascade", "on", "--window", "128")
    try:
        assert _complete(srv, LONG)["cascade"]["config"]["window"] == 128
        assert "cascade" in _complete(srv, "abc")
    finally:
        srv.stop()  # saves the entries: a cascade one for LONG (and for "abc")
    assert list((tmp_path / "prefix_cache").rglob("*")), "the first server saved its entries"
    srv = _served_with_cache(tiny_gguf, "--cascade", "off")
    try:
        body = {"model": srv.model, "prompt": LONG, "max_tokens": 3, "temperature": 0}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 400, r.text  # past the context, with the cascade off: refused, not resumed
        figures = _complete(srv, "abc")
        assert "cascade" not in figures and figures["cached_tokens"] == 0
    finally:
        srv.stop()


def test_serve_says_which_cascade_it_runs():
    from mlotspark.cli.serve import cascade_summary

    def said(*argv: str) -> str:
        return cascade_summary(cascade_kwargs(build_parser().parse_args(["serve", *argv])))

    assert said() == "memory cascade past the context"
    assert said("--cascade", "auto", "--window", "256") == "memory cascade past the context (window 256)"
    assert said("--top-k-blocks", "8") == "memory cascade for every request (top_k 8)"
    assert said("--cascade", "off").startswith("memory cascade off")
