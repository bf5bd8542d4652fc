"""``Engine.load(cascade="auto", cascade_settings=...)`` (``runtime/cache_choice.py``).

On the tiny random model (a 512-token context): a prompt of ``LONG`` tokens is past
it, ``abc`` with 3 new tokens is not.
"""

from __future__ import annotations

from typing import Any

import pytest

from mlotspark.errors import OptionError
from tiny import tiny_model, write_tiny_gguf

LONG = "abcdefgh " * 60  # 540 byte tokens: past the tiny model's 512


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", tiny_model())


# -- the engine's seam: cascade="auto" with cascade_settings -----------------------------------
def test_auto_with_settings_runs_a_long_prompt_through_that_cascade_and_a_short_one_plainly(tiny_gguf):
    from mlotspark.engine import Engine

    engine = Engine.load(str(tiny_gguf), progress=False, cascade="auto",
                         cascade_settings={"window": 128, "top_k": 2})
    try:
        assert engine.cascade == "auto"
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
        assert engine.cascade_for(len(LONG)) == CascadeConfig.for_model(512)
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
