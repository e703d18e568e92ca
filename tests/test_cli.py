"""The CLI as a user runs it (subprocess), on the embedded model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixserve.__main__ import main


def run_cli(*args, stdin=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "radixserve", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def test_generate_prints_a_continuation():
    r = run_cli("generate", "The capital of France is", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_chat_streams_answers_and_keeps_history():
    r = run_cli("chat", "--temperature", "0", "--max-tokens", "30",
                stdin="/help\n/bogus arg\nName three primary colors.\n/reset\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "Red" in r.stdout
    assert "loading the embedded model" in r.stderr and "ready in" in r.stderr
    assert "/reset   forget the conversation" in r.stderr  # /help, answered locally
    assert "unknown command '/bogus'; /help lists them" in r.stderr
    assert "(conversation cleared)" in r.stderr
    assert r.stdout.count(">>> ") == 5  # no model turn for the commands


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--max-tokens", "0"], "max-tokens"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--top-k", "-5"], "top_k"),
    (["generate", "", "--max-tokens", "2"], "empty"),
    (["generate", "hi", "--model", "/nonexistent/model.gguf"], "not found"),
])
def test_bad_arguments_exit_2_with_a_message(args, message, capsys):
    try:
        code = main(args)
    except SystemExit as exc:  # refused by argparse, before anything loads
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_corrupt_gguf_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 10)
    assert main(["generate", "hi", "--model", str(bad)]) == 2
    assert "not a valid GGUF" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "99999", "-1", "http"])
def test_serve_refuses_a_bad_port_before_loading(port, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", port])
    assert exc.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_serve_help_names_every_option_and_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in ("--host HOST address to listen on", "(default: 127.0.0.1)",
                 "--port PORT TCP port, 1-65535 (default: 8000)",
                 "gives up (default: 600.0)"):
        assert line in text
    import argparse

    from radixserve.serve import add_serve_args
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    assert [a.dest for a in parser._actions if not a.help] == []
