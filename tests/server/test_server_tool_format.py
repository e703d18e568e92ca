"""The server resolves ``--tool-call-parser auto`` from the chat template and says which."""

from __future__ import annotations

from server_proc import ServerProc


def test_startup_line_names_the_detected_tool_format():
    server = ServerProc("--mock-engine")  # the default model's template does not read tools
    assert server.stop() == 0
    output = server.proc.stdout.read()
    assert "tool calls: hermes)" in output, output


def test_explicit_parser_is_kept():
    server = ServerProc("--mock-engine", "--tool-call-parser", "llama3_json")
    assert server.stop() == 0
    assert "tool calls: llama3_json)" in server.proc.stdout.read()
