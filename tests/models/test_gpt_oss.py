"""gpt-oss (``GptOssForCausalLM``, GGUF ``gpt-oss``) against transformers: attention with sinks
in both backends (prefill, chunks and decodes, sliding and full) against the softmax written
out; the shape read from config.json and the GGUF metadata alike; logits through the paged KV
cache from the folder and from an F32 file; a file with MXFP4 experts as stored, close to its
own weights in float and batch-invariant bit for bit; the engine's greedy tokens."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_paged_attention import BLOCK, NUM_BLOCKS, WINDOW_CASES
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from tiny_gpt_oss import gpt_oss_hf_to_gguf, make_gpt_oss_hf_model
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.layers.attn_backends.cpu_native import NativeCpuPagedAttention
from radixserve.layers.attn_backends.torch_paged import TorchPagedAttention
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.gpt_oss_config import gpt_oss_hf_config
from radixserve.models.loader import load_model_config
from radixserve.models.source import ModelSource

ATOL = 1e-4
HEADS, KV_HEADS, DIM = 6, 2, 8
BACKENDS = [TorchPagedAttention] + ([NativeCpuPagedAttention] if native.load() else [])
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")


# -- attention with sinks ---------------------------------------------------------------------

def sink_reference(q, keys, values, lens, sinks, window):
    """Row t: p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h)) over its keys (the last
    ``window`` of its first lens[t] where set), in float64."""
    group, scale, out = q.shape[1] // keys[0].shape[1], q.shape[2] ** -0.5, []
    for t in range(q.shape[0]):
        lo = max(0, lens[t] - window) if window else 0
        k = keys[t][lo:lens[t]].double().repeat_interleave(group, dim=1)
        v = values[t][lo:lens[t]].double().repeat_interleave(group, dim=1)
        e = (torch.einsum("hd,lhd->hl", q[t].double(), k) * scale).exp()
        p = e / (e.sum(-1, keepdim=True) + sinks.double().exp()[:, None])
        out.append(torch.einsum("hl,lhd->hd", p, v))
    return torch.stack(out).float()


def run_sinks(seqs, backend, sinks, window, seed=0, num_blocks=NUM_BLOCKS,
              shape=(HEADS, KV_HEADS, DIM)):
    """seqs: (block_ids, start_pos, new tokens), decode-like first; ``shape``: (query heads,
    KV heads, head dim) → (backend's output, the reference)."""
    num_heads, num_kv_heads, dim = shape
    gen = torch.Generator().manual_seed(seed)
    pool = (torch.randn(num_blocks, BLOCK, num_kv_heads, dim, generator=gen),
            torch.randn(num_blocks, BLOCK, num_kv_heads, dim, generator=gen))
    new = [[torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(seed + i))
            for heads in (num_heads, num_kv_heads, num_kv_heads)]
           for i, (_, _, n) in enumerate(seqs)]
    q, k, v = (torch.cat(parts) for parts in zip(*new))  # a sequence's rows: its own draws
    width = max(len(b) for b, _, _ in seqs)
    table = torch.tensor([b + [0] * (width - len(b)) for b, _, _ in seqs])
    slots, row_keys, row_values, lens, t = [], [], [], [], 0
    for blocks, start, n in seqs:
        seq_slots = [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start + n)]
        slots += seq_slots[start:]
        ks, vs = pool[0].flatten(0, 1)[seq_slots], pool[1].flatten(0, 1)[seq_slots]
        ks[start:], vs[start:] = k[t:t + n], v[t:t + n]
        row_keys += [ks] * n
        row_values += [vs] * n
        lens += [start + j + 1 for j in range(n)]
        t += n
    meta = backend.build_metadata(
        slot_mapping=torch.tensor(slots), block_table=table,
        context_lens=[s + n for _, s, n in seqs], q_lens=[n for _, _, n in seqs],
        start_pos=[s for _, s, _ in seqs], block_size=BLOCK)
    got = backend.forward(q, k, v, pool, meta, dim ** -0.5, window, None, sinks=sinks)
    return got, sink_reference(q, row_keys, row_values, lens, sinks, window)


@pytest.mark.parametrize("backend_cls", BACKENDS, ids=lambda c: c.name)
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_attention_sinks_match_the_softmax_written_out(case, window, backend_cls):
    """Decode rows (beside a shared prefix: the torch cascade is bypassed), short chunks,
    fresh prompts and chunks with cached context, full and sliding; sinks large enough to
    take most of a row's weight."""
    sinks = 2.0 * torch.randn(HEADS, generator=torch.Generator().manual_seed(1))
    got, want = run_sinks(WINDOW_CASES[case], backend_cls(), sinks, window)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("window", [None, 128])
def test_native_sinks_in_long_chunked_rows_match_and_keep_each_rows_bits(window):
    """gpt-oss's heads (16 query heads per 2 KV heads of 64: the specialised kernel) at every
    level: a context over 512 tokens is attended in chunks, the sink joining once where they
    merge; a prompt's rows share tiles. The formula, and a row's bits alone equal its bits in
    the batch."""
    backend = NativeCpuPagedAttention()
    sinks = 2.0 * torch.randn(16, generator=torch.Generator().manual_seed(2))
    seqs = [(list(range(1, 165)), 650, 1), ([300, 301, 302], 9, 1),
            (list(range(165, 297)), 520, 1), ([303, 304, 305, 306, 307], 0, 19)]
    run = {"seed": 4, "num_blocks": 320, "shape": (16, 2, 64)}
    together, want = run_sinks(seqs, backend, sinks, window, **run)
    torch.testing.assert_close(together, want, rtol=1e-4, atol=1e-5)
    alone, _ = run_sinks(seqs[:1], backend, sinks, window, **run)
    assert torch.equal(alone[0], together[0])


# -- the model --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gpt_oss_hf_model(tmp_path_factory.mktemp("gpt_oss") / "hf", seed=3)


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' model (eager attention: its sinks), EOS off for ``generate``."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def test_hf_config_reads_the_layers_rope_and_experts(folder):
    cfg = config_of(folder)
    assert cfg.architecture == "GptOssForCausalLM" and cfg.attention_bias
    assert [cfg.layer_window(i) for i in range(4)] == [8, None, 8, None]
    assert cfg.rope_theta == 150000.0 and cfg.rope_scaling["rope_type"] == "yarn"
    assert cfg.rope_scaling["truncate"] is False
    e = cfg.moe
    assert (e.num_experts, e.top_k, e.intermediate_size, e.scoring, e.expert_activation,
            e.linear_bias, e.norm_topk_prob, e.swiglu_limit, e.swiglu_alpha) == (
        4, 2, 64, "softmax_topk", "swiglu_oai", True, False, 0.25, 1.702)


def test_mxfp4_folders_are_refused_naming_what_runs(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with pytest.raises(ValueError, match="GGUF"):
        gpt_oss_hf_config(cfg, "GptOssForCausalLM")


def test_gguf_config_equals_hf_config(folder, tmp_path):
    ours = config_of(gpt_oss_hf_to_gguf(folder, tmp_path / "m.gguf"))
    hf = config_of(folder)
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    # the swiglu limit: llama.cpp's graph fixes 7.0 (the releases'), the tiny model's is lower
    assert ours.moe.swiglu_limit == 7.0
    assert dataclasses.replace(ours, rms_norm_eps=hf.rms_norm_eps,
                               moe=dataclasses.replace(ours.moe, swiglu_limit=0.25)) == hf


@pytest.mark.parametrize("backend", [c.name for c in BACKENDS])
def test_chunks_and_decodes_match_transformers(backend, folder, reference):
    """A packed prefill, then chunks and decodes at different paces across the 8-token
    window, from the folder."""
    runner = runner_for(folder, backend)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    paged = Paged(tokens, 4, seed=3)
    plan = [[(0, 6), (1, 1)], [(0, 7), (1, 10), (2, 1)], [(0, 1), (1, 1), (2, 6)],
            [(0, 3), (2, 1), (1, 11)], [(0, 13), (2, 6)]]
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


def _gguf_reference(folder, limit):
    """transformers' model with llama.cpp's SwiGLU limit (the file does not carry it)."""
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                swiglu_limit=limit).eval()


def test_gguf_f32_file_matches_transformers(folder, tmp_path):
    runner = runner_for(gpt_oss_hf_to_gguf(folder, tmp_path / "m.gguf"))
    reference = _gguf_reference(folder, 7.0)
    tokens = prompts(runner.config.vocab_size, (26, 11), seed=6)
    paged = Paged(tokens, 4)
    for step in ([(0, 19), (1, 11)], [(0, 1)], [(0, 6)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)


@needs_native
def test_mxfp4_experts_as_stored_are_close_and_batch_invariant(folder, tmp_path):
    """Experts stored as MXFP4 (the releases' GGUF files), the rest Q8_0, run as stored:
    close to the same file in float, and a sequence's logits the same bits alone, in a batch
    and in chunks."""
    path = gpt_oss_hf_to_gguf(folder, tmp_path / "m.gguf", "Q8_0", experts="MXFP4")
    stored, floats = runner_for(path, quantization="gguf"), runner_for(path)
    assert isinstance(stored.model.layers[0].mlp.experts[0].gate_up_proj, BlockLinear)
    tokens = prompts(stored.config.vocab_size, (21, 9, 14), seed=7)
    whole = stored.all_logits([Paged(tokens, 4).chunk(0, 21)])[0]
    log_p = torch.log_softmax(floats.all_logits([Paged(tokens, 4).chunk(0, 21)])[0], -1)
    kl = (log_p.exp() * (log_p - torch.log_softmax(whole, -1))).sum(-1)
    assert kl.max() < 0.01, kl
    alone = Paged(tokens, 4)
    pieces = [stored.all_logits([alone.chunk(0, n)])[0] for n in (1, 6, 3, 11)]
    assert torch.equal(torch.cat(pieces), whole)
    batched = Paged(tokens, 4)
    first = stored.all_logits([batched.chunk(1, 9), batched.chunk(0, 10), batched.chunk(2, 14)])
    second = stored.all_logits([batched.chunk(0, 11)])
    assert torch.equal(torch.cat([first[1], second[0]]), whole)


@needs_native
def test_bf16_folder_loads_as_stored_as_in_float(folder, tmp_path):
    """A bfloat16 folder in auto mode: its linears, the fused experts cut per expert (gate and
    up columns de-interleaved, transposed), 16-bit as stored; the same logits as the folder's
    bf16 weights in float32."""
    from safetensors.torch import load_file, save_file

    half = make_gpt_oss_hf_model(tmp_path / "bf16", seed=3)
    state = load_file(str(half / "model.safetensors"))
    save_file({k: t.to(torch.bfloat16) for k, t in state.items()},
              str(half / "model.safetensors"), metadata={"format": "pt"})
    stored, floats = runner_for(half, quantization="16bit-stored"), runner_for(half)
    assert isinstance(stored.model.layers[1].mlp.experts[3].down_proj, BlockLinear)
    tokens = prompts(stored.config.vocab_size, (17,), seed=9)
    ours = stored.all_logits([Paged(tokens, 4).chunk(0, 17)])[0]
    want = floats.all_logits([Paged(tokens, 4).chunk(0, 17)])[0]
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)


def test_llm_greedy_equals_transformers_generate(folder, reference):
    """The folder through the engine (blocks of 4, a chunked batch past the window):
    transformers' own greedy tokens."""
    llm = LLM(str(folder), block_size=4, show_progress=False, max_num_batched_tokens=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    batch = prompts(llm.engine.vocab_size, (5, 22, 13), seed=11)
    for prompt, result in zip(batch, llm.generate(batch, greedy)):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     do_sample=False)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
