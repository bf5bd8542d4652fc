"""Options never lose silently: conflicts are refused with one line naming both options,
in each surface's own words (one check: ``GenerationOptions``, plus the CLI's own flags)."""

from __future__ import annotations

import pytest

from mlotspark.cli.entry import main
from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions


def cli_error(capsys, *argv: str) -> str:
    code = main(["generate", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("mlotspark: error:"), err
    return err[0]


# (flags, the two flags the one line must name)
CLI_CONFLICTS = [
    (["--beams", "2", "--speculative", "prompt_lookup"], ("--beams", "--speculative")),
    (["--num-return-sequences", "2", "--speculative", "prompt_lookup"], ("--num-return-sequences", "--speculative")),
    (["--speculative", "draft"], ("--speculative", "--draft-model")),
    (["--draft-model", "x"], ("--draft-model", "--speculative")),
    (["--beams", "2", "--num-return-sequences", "3"], ("--num-return-sequences", "--beams")),
    (["--beams", "2", "--temp", "0.8"], ("--temp", "--beams")),
    (["--beams", "2", "--top-p", "0.5"], ("--top-p", "--beams")),
    (["--beams", "2", "--seed", "1"], ("--seed", "--beams")),
    (["--length-penalty", "0.5"], ("--length-penalty", "--beams")),
    (["--raw", "--system", "x"], ("--system", "--raw")),
    (["--output", "o.jsonl"], ("--output", "--prompts")),
    (["--prompts", "p.txt", "-p", "hi"], ("--prompt", "--prompts")),
    (["--prompts", "p.txt", "hi"], ("--prompt", "--prompts")),  # the prompt as an argument
    (["-p", "hi", "hello"], ("argument", "--prompt")),
    (["--prompts", "p.txt", "--json"], ("--json", "--prompts")),
    (["--no-cascade", "--window", "64"], ("--no-cascade", "--window")),
    (["--prompts", "p.txt", "--num-return-sequences", "2", "--length-penalty", "0.5"],
     ("--length-penalty", "--prompts")),
    (["--beams", "2", "--json-schema", "s.json"], ("--json-schema", "--beams")),
    (["--speculative", "prompt_lookup", "--json-schema", "s.json"], ("--json-schema", "--speculative")),
    (["--num-return-sequences", "2", "--json-schema", "s.json"], ("--json-schema", "--num-return-sequences")),
    (["--speculative", "prompt_lookup", "--window", "64"], ("--speculative", "--window")),
    (["--cache-kind", "q8", "--top-k-blocks", "2"], ("--cache-kind", "--top-k-blocks")),
]


@pytest.mark.parametrize("argv, flags", CLI_CONFLICTS, ids=[" ".join(a) for a, _ in CLI_CONFLICTS])
def test_cli_refuses_each_conflict_naming_both_flags(capsys, argv, flags, tmp_path, monkeypatch):
    (tmp_path / "s.json").write_text('{"type": "object"}')
    monkeypatch.chdir(tmp_path)
    line = cli_error(capsys, *argv)
    for f in flags:
        assert f in line
    assert "num_beams" not in line and "draft_model" not in line  # flags, not API names
    assert "response_format" not in line and "response-format" not in line


def test_sampling_knobs_with_greedy_are_said_not_refused():
    """A seed or a sampling filter with temperature 0 changes nothing: said once, not
    refused (OpenAI clients send top_p=1 with temperature=0 as a matter of course)."""
    opts = GenerationOptions().merged(temperature=0, seed=3, top_p=0.5)
    assert opts.ignored({"temperature", "seed", "top_p"}) == [("top_p", "temperature"), ("seed", "temperature")]
    assert GenerationOptions().merged(temperature=0.7, seed=3).ignored({"seed"}) == []


def test_beams_with_greedy_temperature_is_consistent():
    opts = GenerationOptions().merged(num_beams=2, temperature=0)
    assert opts.num_beams == 2


def test_engine_defaults_never_conflict():
    # A model's or engine's own sampling defaults are not the caller's choice: beams win.
    defaults = GenerationOptions().merged(temperature=0.6, top_p=0.9)
    assert defaults.merged(num_beams=3).num_beams == 3


def test_api_names_options_its_way():
    with pytest.raises(OptionError) as e:
        GenerationOptions().merged(num_beams=2, speculative="prompt_lookup")
    assert "num_beams" in str(e.value) and "speculative" in str(e.value)
    assert e.value.options == ("num_beams", "speculative")
    slash = {"temperature": "/temp"}
    with pytest.raises(OptionError) as e:
        GenerationOptions().merged(num_beams=2, temperature=0.5)
    assert e.value.render(lambda n: slash.get(n, n)).startswith("/temp conflicts with num_beams")


def test_mode_capping_max_batch_is_said_once(capsys, monkeypatch):
    from mlotspark.cli import batch
    from mlotspark.cli.entry import build_parser

    args = build_parser().parse_args(["generate", "--mode", "efficiency", "--max-batch", "2"])
    kwargs = batch.scheduler_kwargs(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert kwargs["max_batch"] == 2 and len(err) == 1
    assert "--mode efficiency" in err[0] and "at most 1" in err[0] and "--max-batch 2" in err[0]
    args = build_parser().parse_args(["generate", "--mode", "efficiency"])  # no --max-batch given
    batch.scheduler_kwargs(args)
    assert capsys.readouterr().err == ""


def test_beams_on_a_prompt_the_cascade_holds_say_why_it_holds_it(tmp_path):
    # Under ``cascade="auto"`` a prompt past the context gets the cascade, whose cache beams
    # cannot copy row-wise: the refusal says why this request has it, not only its class.
    from mlotspark import Engine
    from tiny import tiny_model, write_tiny_gguf

    engine = Engine.load(str(write_tiny_gguf(tmp_path / "t.gguf", tiny_model())), progress=False)
    try:
        with pytest.raises(OptionError, match="memory cascade holds this request: it was turned on, or its prompt plus max_tokens"):
            engine.generate("hello " * 400, raw=True, num_beams=2, max_tokens=4)
        assert engine.generate("hello", raw=True, num_beams=2, max_tokens=2).tokens  # a short one beams
    finally:
        engine.close()
