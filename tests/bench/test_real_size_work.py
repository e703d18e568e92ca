"""benchmarks/real_size.py's weight-work lines: the multiply-adds a workload asks of the
weights, and the rates they imply (what issue 29's ratios are held against)."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import real_size  # noqa: E402


def _gguf(path: Path, tensors: dict[str, tuple[int, ...]]) -> str:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_weight_macs_count_the_layers_matrices_and_the_head(tmp_path):
    dense = {"token_embd.weight": (50, 8), "blk.0.attn_norm.weight": (8,),
             "blk.0.attn_q.weight": (8, 8), "blk.0.ffn_up.weight": (24, 8),
             "blk.1.ffn_down.weight": (8, 24), "output_norm.weight": (8,)}
    tied = _gguf(tmp_path / "tied.gguf", dense)
    assert real_size.weight_macs(tied) == (64 + 192 + 192, 400)  # the head: the embedding
    own = _gguf(tmp_path / "own.gguf", {**dense, "output.weight": (60, 8)})
    assert real_size.weight_macs(own) == (448, 480)
    moe = _gguf(tmp_path / "moe.gguf", {**dense, "blk.0.ffn_up_exps.weight": (4, 24, 8)})
    assert real_size.weight_macs(moe) is None  # only the routed experts run: not counted


def test_work_lines_rates_and_the_targets_rate():
    macs = (1_000_000_000, 100_000_000)  # 1 GMAC a token through the layers, 0.1 in the head
    rows = [("llama-server", 0, 0, {"b16": {"n_requests": 16, "prompt_tokens": 100,
                                            "output_tokens": 1600, "wall_s": 100.0},
                                    "a": {"n_requests": 1, "prompt_tokens": 100,
                                          "output_tokens": 100, "ttft_s": 2.0}}),
            ("radixserve", 0, 0, {"b16": {"n_requests": 16, "prompt_tokens": 100,
                                          "output_tokens": 1600, "wall_s": 40.0},
                                  "a": {"n_requests": 1, "prompt_tokens": 100,
                                        "output_tokens": 100, "ttft_s": 1.0}})]
    a, b16 = real_size.work_lines(rows, ["a", "b16"], macs)
    # a: the prompt's 100 tokens and one head row, over the TTFT
    assert a.startswith("a: 0.10 TMAC") and "llama-server 50 GMAC/s" in a
    assert "radixserve 100 GMAC/s" in a and "2x llama-server's would take 100" in a
    # b16: 16 x 100 prompt tokens, then 16 x 99 later tokens, 1,600 head rows, over the wall
    work = (1600 + 1584) * 1e9 + 1600 * 1e8
    assert b16.startswith(f"b16: {work / 1e12:.2f} TMAC")
    assert f"radixserve {work / 40 / 1e9:,.0f} GMAC/s" in b16
    assert f"3x llama-server's would take {3 * work / 100 / 1e9:,.0f}" in b16


def test_work_lines_skip_a_workload_without_its_counts():
    rows = [("radixserve", 0, 0, {"b16": {"wall_s": 10.0}})]
    assert real_size.work_lines(rows, ["b16"], (1, 1)) == []


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not shutil.which("g++"),
                    reason="the ceiling's loops are x86 instructions, built with g++")
def test_int8_ceiling_measures_the_levels_the_cpu_has(tmp_path):
    flags = Path("/proc/cpuinfo").read_text().split()
    ceiling = real_size.int8_ceiling(tmp_path, 1)
    assert ("avx2" in ceiling) == ("avx2" in flags)
    assert ("avx512" in ceiling) == ("avx512_vnni" in flags and "avx512bw" in flags)
    assert all(rate > 1 for rate in ceiling.values())  # GMAC/s, one thread
