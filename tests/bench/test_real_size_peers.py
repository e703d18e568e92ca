"""benchmarks/real_size.py's second peer: ik_llama.cpp's server runs with llama-server's flags,
and every row's figures carry their ratios to both peers (issue 57's targets beside issue 29's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import real_size


def _args(**kw) -> argparse.Namespace:
    base = {"model": "/m/x.gguf", "llama_server": "/ls/llama-server", "ik_llama_server": None,
            "llama_args": "", "ik_llama_args": "", "threads": 2, "kv_tokens": 4096,
            "radixserve_only": False, "speculative": "off"}
    return argparse.Namespace(**{**base, **kw})


def test_ik_runs_with_llama_servers_flags_plus_its_own():
    runs = real_size.server_runs(_args(ik_llama_server="/ik/llama-server", ik_llama_args="-rtr",
                                       llama_args="--no-repack"), "x")
    assert [r[0] for r in runs] == ["llama-server", "ik-llama-server", "radixserve-spec-off"]
    (_, ls_cmd, ls_port), (_, ik_cmd, ik_port) = runs[0], runs[1]
    assert ls_cmd[0] == "/ls/llama-server" and ik_cmd[0] == "/ik/llama-server"
    assert ik_port != ls_port != runs[2][2]
    ls_flags = [a for a in ls_cmd[1:] if a not in ("--port", str(ls_port))]
    ik_flags = [a for a in ik_cmd[1:] if a not in ("--port", str(ik_port))]
    assert ls_flags[-1] == "--no-repack"  # llama-server's own extra flags: its alone
    assert ik_flags == ls_flags[:-1] + ["-rtr"]
    assert ls_flags[ls_flags.index("-c") + 1] == "4096" and "-cb" in ls_flags


def test_without_ik_only_llama_server_and_radixserve_run():
    runs = real_size.server_runs(_args(speculative="off,auto"), "x")
    assert [r[0] for r in runs] == ["llama-server", "radixserve-spec-off",
                                    "radixserve-spec-auto"]
    assert [r[0] for r in real_size.server_runs(_args(radixserve_only=True), "x")] == [
        "radixserve-spec-off"]


def _row(peer: str, ttft: float, decode: float) -> tuple:
    return (peer, 1.0, 1000.0, {"a": {"n_requests": 1, "prompt_tokens": 100,
                                      "output_tokens": 100, "ttft_s": ttft,
                                      "decode_tok_s": decode}})


def test_table_gives_each_row_its_ratio_to_each_peer(capsys):
    rows = [_row("llama-server", 2.0, 10.0), _row("ik-llama-server", 1.0, 20.0),
            _row("radixserve-spec-off", 0.5, 30.0)]
    real_size.print_table(rows, ["a"])
    lines = capsys.readouterr().out.splitlines()
    ls_line, ik_line, ours = lines[2:5]
    assert "| 2 (2.00x ik) |" in ls_line  # the peers against each other
    assert "| 1 (0.50x ls) |" in ik_line
    assert "| 0.5 (0.25x ls, 0.50x ik) |" in ours and "| 30 (3.00x ls, 1.50x ik) |" in ours


def test_work_lines_name_both_peers_targets():
    rows = [_row("llama-server", 2.0, 10.0), _row("ik-llama-server", 1.0, 20.0),
            _row("radixserve-spec-off", 0.5, 30.0)]
    (line,) = real_size.work_lines(rows, ["a"], (1_000_000_000, 0))
    # 100 GMAC over 2 s, 1 s, 0.5 s; TTFT <= 0.5x llama-server's, <= 0.9x ik_llama.cpp's
    assert "llama-server 50 GMAC/s, ik-llama-server 100 GMAC/s, radixserve-spec-off 200" in line
    assert "2x llama-server's would take 100" in line
    assert "1.11x ik-llama-server's would take 111" in line
