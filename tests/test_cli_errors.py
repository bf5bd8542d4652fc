"""A user mistake gives one clear line naming the bad value and a non-zero exit."""

from __future__ import annotations

import pytest

from mlotspark.cli.entry import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "--temp", "-1"], "invalid --temp -1.0"),
        (["generate", "--top-p", "0"], "invalid --top-p 0.0"),
        (["generate", "--max-tokens", "0"], "invalid --max-tokens 0"),
        (["generate", "-m", "no-such-model"], "no-such-model"),
        (["generate", "-m", "/nowhere/model.gguf"], "/nowhere/model.gguf"),
        # mlx.launch gives no rank a terminal: pointed to the commands that run across ranks.
        (["chat", "--distributed", "pipeline"], "mlotspark generate --distributed pipeline"),
    ],
)
def test_errors_are_one_line(capsys, argv, needle):
    code, err = run(capsys, *argv)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("mlotspark: error:") and needle in err[0]


def test_corrupt_gguf_is_named(tmp_path, capsys):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    code, err = run(capsys, "generate", "-m", str(bad))
    assert code == 2 and "broken.gguf" in err[-1] and len(err) == 1


def test_model_directory_missing_pieces(tmp_path, capsys):
    d = tmp_path / "mymodel"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    code, err = run(capsys, "generate", "-m", str(d))
    assert code == 2 and "safetensors" in err[-1]


def test_unsupported_architecture_in_a_directory(tmp_path, capsys):
    import mlx.core as mx

    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "nosucharch", "vocab_size": 10}')
    mx.save_safetensors(str(d / "model.safetensors"), {"w": mx.zeros((2,))})
    (d / "tokenizer.json").write_text("{}")
    code, err = run(capsys, "generate", "-m", str(d))
    assert code == 2 and "nosucharch" in err[-1]


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("generate", "pull", "info"):
        assert cmd in out


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--temp", "abc"], "argument --temp/--temperature: invalid float value: 'abc'"),
    (["generate", "--max-tokens", "many"], "invalid int value: 'many'"),
    (["serve", "--port", "eighty"], "invalid int value: 'eighty'"),
    (["bench", "--suite", "pp", "-r", "x"], "invalid integer 'x'"),
])
def test_a_non_number_for_a_number_flag_is_one_line(capsys, argv, needle):
    """argparse printed the whole usage first (26 lines for ``generate --temp abc``)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and needle in err[0], err
    assert err[0].startswith("mlotspark ") and err[0].endswith("--help)")


@pytest.mark.parametrize("prompt, needle", [("", "--prompt is empty"), ("  \n", "--prompt is blank")])
def test_an_empty_prompt_is_refused_before_the_model_loads(capsys, prompt, needle):
    code, err = run(capsys, "generate", "-m", "/nowhere/model.gguf", "-p", prompt)
    assert code == 2 and len(err) == 1 and needle in err[0]  # not the missing model: nothing loaded


def test_an_empty_stdin_prompt_is_refused(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("   \n"))
    code, err = run(capsys, "generate", "-m", "/nowhere/model.gguf", "-p", "-")
    assert code == 2 and len(err) == 1 and "the prompt read from stdin is empty" in err[0]


def test_serve_on_a_busy_port_fails_in_one_line_before_loading(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(capsys, "serve", "-m", "/nowhere/model.gguf", "--port", str(port))
    assert code == 2 and err == [f"mlotspark: error: cannot listen on 127.0.0.1:{port}: in use "
                                 "(another server there? pick one with --port)"]
