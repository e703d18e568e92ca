"""benchmarks/make_hybrid_gguf.py and hybrid_chat.py: a random qwen35 file of a tiny custom
shape has llama.cpp's tensor names, shapes and block types, sane small tensors and a zeroed
padded vocabulary, and radixserve loads it and generates; the chat client's requests and server
commands, its reading of a stream (radixserve's usage, llama-server's timings), its report
(hybrid_chat_report.py), and a whole chat against ``radixserve serve --mock-engine``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
import hybrid_chat as hc
import make_hybrid_gguf as mhg
from server_proc import ServerProc

from radixserve import LLM, SamplingParams
from radixserve.gguf_reader import open_gguf

# hidden 256, so the q4_k_m recipe's K-quants fit the matrices read along it; the 128-wide
# DeltaNet output and the FFN's 512 take the fallbacks (Q5_0 / Q8_0)
TINY = mhg.HybridShape(layers=4, hidden=256, heads=4, kv_heads=2, ffn=512, key_heads=2,
                       value_heads=4, vocab=50000, head_dim=64, rotary=16, state_dim=32,
                       mrope_sections=(3, 3, 2), context=4096)
T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    return mhg.write(TINY, tmp_path_factory.mktemp("hybrid") / "tiny.gguf", seed=1)


@pytest.fixture(scope="module")
def reader(tiny_file) -> gguf.GGUFReader:
    return open_gguf(tiny_file)


def _tensors(reader: gguf.GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


def test_tensors_are_named_shaped_and_typed_as_llama_cpp_writes_them(reader):
    t = _tensors(reader)
    assert "output.weight" not in t  # tied
    assert t["token_embd.weight"].tensor_type == T.Q6_K  # the head's type
    # layer 3 is full attention, 0-2 Gated DeltaNet
    assert {n.split(".")[2] for n in t if n.startswith("blk.3.")} == {
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
        "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down"}
    assert {n.split(".", 2)[2] for n in t if n.startswith("blk.0.")} == {
        "attn_norm.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight",
        "ssm_dt.bias", "ssm_a", "ssm_beta.weight", "ssm_alpha.weight", "ssm_norm.weight",
        "ssm_out.weight", "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight",
        "ffn_down.weight"}
    # ggml's order (columns first): q and gate per head; qkv = 2 x 64 key + 128 value channels
    assert list(t["blk.3.attn_q.weight"].shape) == [256, 512]
    assert list(t["blk.0.attn_qkv.weight"].shape) == [256, 256]
    assert list(t["blk.0.ssm_conv1d.weight"].shape) == [4, 256]
    assert list(t["blk.0.ssm_alpha.weight"].shape) == [256, 4]
    # use_more_bits picks layers 2 and 3 of 4: attn_qkv counts as attn_v
    assert [t[f"blk.{i}.attn_qkv.weight"].tensor_type for i in range(3)] == [T.Q4_K, T.Q4_K,
                                                                            T.Q6_K]
    assert t["blk.3.attn_v.weight"].tensor_type == T.Q6_K
    assert t["blk.0.ssm_beta.weight"].tensor_type == T.Q4_K
    assert t["blk.0.ssm_out.weight"].tensor_type == T.Q5_0  # 128 columns
    assert t["blk.2.ffn_down.weight"].tensor_type == T.Q6_K
    assert t["blk.1.ffn_down.weight"].tensor_type == T.Q4_K
    assert t["blk.0.ssm_conv1d.weight"].tensor_type == T.F32


def test_small_tensors_keep_the_recurrence_sane(reader):
    t = _tensors(reader)
    a = np.asarray(t["blk.0.ssm_a"].data)
    assert a.shape == (4,) and ((a <= -0.05) & (a >= -1.0)).all()
    for name in ("blk.0.attn_norm.weight", "blk.0.ssm_norm.weight", "output_norm.weight"):
        assert abs(float(np.mean(t[name].data)) - 1.0) < 0.05
    assert float(np.abs(np.asarray(t["blk.1.ssm_conv1d.weight"].data)).max()) < 2.0
    fields = reader.fields
    assert list(fields["qwen35.attention.recurrent_layers"].contents()) == [True, True, True,
                                                                           False]
    assert fields["qwen35.rope.dimension_count"].contents() == 16


def test_padded_vocabulary_rows_are_zero(reader):
    embd = _tensors(reader)["token_embd.weight"]
    real = mhg.num_real_tokens()
    rows = np.asarray(embd.data).reshape(TINY.vocab, -1)
    assert not rows[real:].any() and rows[:real].any(axis=1).all()


def test_radixserve_loads_it_and_generates(tiny_file):
    llm = LLM(str(tiny_file), show_progress=False)
    out = llm.generate([[1, 2, 3, 4, 5, 6]], SamplingParams(temperature=0.0, max_tokens=8,
                                                           ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 8
    assert max(out.token_ids) < mhg.num_real_tokens()  # never a zeroed padding row


def test_unknown_recipe_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown recipe 'q3'"):
        mhg.write(TINY, tmp_path / "x.gguf", recipe="q3")


# --- hybrid_chat -------------------------------------------------------------------------------


def test_request_body_is_greedy_streamed_and_ignores_eos():
    body = hc.request_body("m", [{"role": "user", "content": "hi"}], 32)
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 32, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert "model" not in hc.request_body(None, [], 1)


def test_server_commands_share_threads_and_context_and_carry_their_own_flags():
    args = argparse.Namespace(model="/m.gguf", threads=2, ctx=16384, llama_server="/bin/ls-srv",
                              llama_args="--no-repack --ctx-checkpoints 0", radixserve_args="",
                              servers="llama-server,radixserve", tag="x")
    (ls_label, ls, ls_port), (rs_label, rs, rs_port) = hc.server_runs(args)
    assert (ls_label, rs_label) == ("llama-server (x)", "radixserve (x)")  # in --servers order
    assert ls == ["/bin/ls-srv", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", str(ls_port),
                  "-t", "2", "-tb", "2", "-c", "16384", "--no-repack", "--ctx-checkpoints", "0"]
    assert rs[1:] == ["serve", "--model", "/m.gguf", "--port", str(rs_port), "--threads", "2",
                      "--max-model-len", "16384"]
    assert ls_port != rs_port


def test_reply_reads_radixserve_usage_and_llama_server_timings():
    rs = hc.Reply()
    rs.read({"choices": [{"delta": {"role": "assistant"}}]}, 0.1)  # no text: not the first token
    rs.read({"choices": [{"delta": {"content": "a"}}]}, 0.5)
    rs.read({"choices": [{"delta": {"content": "b"}}]}, 0.7)
    rs.read({"choices": [{"delta": {"content": "c"}}]}, 0.9)
    rs.read({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                                      "prompt_tokens_details": {"cached_tokens": 96}}}, 1.0)
    assert (rs.text, rs.ttft_s, rs.prompt_tokens, rs.cached_tokens) == ("abc", 0.5, 100, 96)
    assert rs.decode_tok_s == pytest.approx(4 / 0.4)  # 5 tokens, the last 4 over 0.4 s
    ls = hc.Reply()
    ls.read({"choices": [{"delta": {"content": "x"}}]}, 2.0)
    ls.read({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 1},
             "timings": {"cache_n": 0, "prompt_n": 100}}, 2.1)
    assert ls.cached_tokens == 0 and ls.decode_tok_s is None
    with pytest.raises(RuntimeError, match="error event"):
        hc.Reply().read({"error": {"message": "boom"}}, 0.0)


def _run(label: str, ttfts: list[float], cached: list[int]) -> dict:
    turns = [{"ttft_s": t, "decode_tok_s": 10.0, "cached_tokens": c, "prompt_tokens": 4000,
              "output_tokens": 32, "last_s": t + 3.1} for t, c in zip(ttfts, cached)]
    single = {"512": {"ttft_s": 2.0, "decode_tok_s": 9.0, "prompt_tokens": 520}}
    return {"label": label, "turns": turns, "single": single,
            "spec": {"max_tokens": 32}}


def test_report_puts_servers_side_by_side_with_the_later_turns_ratio():
    text = hc.report([_run("radixserve", [10.0, 1.0, 1.0], [0, 3990, 3990]),
                      _run("llama-server", [20.0, 4.0, 2.0], [0, 0, 0])])
    lines = text.splitlines()
    assert lines[0].startswith("| turn | radixserve TTFT s | radixserve decode tok/s")
    assert lines[0].endswith("| TTFT llama-server/radixserve |")
    assert lines[3] == "| 2 | 1.00 | 10.00 | 3990/4000 | 4.00 | 10.00 | 0/4000 | 4.00x |"
    assert ("turns 2-3 mean TTFT: radixserve 1.00 s, llama-server 3.00 s; ratio "
            "llama-server/radixserve 3.00x") in text
    assert "| 512 words (520 tokens) | 2.00 | 9.00 | 2.00 | 9.00 |" in text
    assert "other than max_tokens" not in text


def test_report_flags_a_wrong_output_count():
    run = _run("radixserve", [1.0, 1.0], [0, 0])
    run["turns"][1]["output_tokens"] = 31
    assert "output tokens other than max_tokens: radixserve turn 2: 31" in hc.report([run])


@pytest.fixture(scope="module")
def mock_server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "1", timeout=120)
    yield s
    assert s.stop() == 0


def test_a_whole_chat_against_the_mock_engine(mock_server, tmp_path):
    spec = hc.ChatSpec(system_tokens=200, user_tokens=20, turns=3, max_tokens=8,
                       single=(64,), single_max_tokens=4)
    run = hc.measure(mock_server.url, spec, "mock")
    assert [t["output_tokens"] for t in run["turns"]] == [8, 8, 8]
    prompts = [t["prompt_tokens"] for t in run["turns"]]
    assert prompts[0] > 200 and prompts[0] < prompts[1] < prompts[2]  # the history grows
    assert all(t["ttft_s"] > 0 and t["cached_tokens"] is not None for t in run["turns"])
    assert run["single"]["64"]["output_tokens"] == 4
    out = tmp_path / "run.json"
    out.write_text(json.dumps([run]))
    assert hc.report(json.loads(out.read_text())).startswith("| turn | mock TTFT s")
