"""Multi-head latent attention decoders (GLM-4.7-Flash, DeepSeek-V3, DeepSeek-V2-Lite's routing;
tiny_mla.py) against
transformers in float32: the shape from config.json and from the ``deepseek2`` GGUF file
llama.cpp's converter writes, packed prefill, chunks and decodes through the paged cache (the
absorbed form over one latent row per token) from the folder and the F32 file, the Q8_0 file
dequantized and as stored (close, and batch-invariant exactly), the pool's bytes per token
(kv_lora_rank + rope dims per layer, for the tiny models and GLM-4.7-Flash's real shape),
greedy generation through ``LLM``."""

from __future__ import annotations

import dataclasses
import json

import gguf
import pytest
import torch
from kquants import quantize
from test_families60 import run_plan
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from tiny_mla import KINDS, make_mla_hf_model, mla_hf_to_gguf
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.models.deepseek2_config import deepseek2_hf_config
from radixserve.models.loader import load_model_config
from radixserve.models.mla_paged import latent_attention
from radixserve.models.source import ModelSource
from radixserve.runner.kv_cache import allocate_kv_cache, bytes_per_block

BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]
needs_native = pytest.mark.skipif(native.load() is None, reason="needs the native kernels")
# GLM-4.7-Flash's config.json (zai-org/GLM-4.7-Flash), the fields that size its attention
GLM47_FLASH = {"architectures": ["Glm4MoeLiteForCausalLM"], "vocab_size": 154880,
               "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
               "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
               "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
               "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 64,
               "num_experts_per_tok": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
               "rope_theta": 1000000.0, "max_position_embeddings": 202752}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla")
    return {kind: make_mla_hf_model(kind, root / kind, seed=3) for kind in KINDS}


@pytest.fixture(scope="module")
def references(folders):
    return {kind: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            for kind, d in folders.items()}


@pytest.fixture(scope="module")
def gguf_files(folders, tmp_path_factory):
    """(kind, ftype) → the file the converter writes (tiny_mla.py's writer)."""
    root = tmp_path_factory.mktemp("mla_gguf")
    return {(kind, ftype): mla_hf_to_gguf(folders[kind], root / f"{kind}-{ftype}.gguf", ftype)
            for kind in KINDS for ftype in ("F32", "Q8_0")}


def test_config_json_says_the_latent_shape(folders):
    glm = load_model_config(ModelSource.resolve(str(folders["glm4_moe_lite"])))
    assert (glm.num_kv_heads, glm.head_dim) == (1, 32 + 8)  # one latent row: kv_lora + rope
    assert glm.mla.q_lora_rank == 32 and glm.mla.rope_interleave
    assert glm.mla.softmax_scale == pytest.approx((32 + 8) ** -0.5)
    moe = glm.moe
    assert (moe.dense_layers, moe.scoring, moe.expert_bias, moe.num_groups,
            moe.topk_groups, moe.routed_scaling, moe.shared_expert_size,
            moe.shared_expert_gate) == ((0,), "sigmoid", True, 2, 1, 1.8, 32, False)
    v3 = load_model_config(ModelSource.resolve(str(folders["deepseek_v3"])))
    assert v3.mla.q_lora_rank is None and v3.rope_scaling["rope_type"] == "yarn"
    mscale = 0.1 * 1.0 * torch.log(torch.tensor(4.0)).item() + 1.0  # yarn_get_mscale(4, 1)
    assert v3.mla.softmax_scale == pytest.approx(40 ** -0.5 * mscale ** 2)
    assert (v3.moe.dense_layers, v3.moe.num_groups, v3.moe.topk_groups) == ((0,), 4, 2)


def test_pool_holds_one_latent_row_per_token(folders):
    """bytes per token and layer = (kv_lora_rank + rope) * element size, K and V one tensor;
    GLM-4.7-Flash's real shape: 576 elements per layer against 10,240 for per-head K / V."""
    cfg = load_model_config(ModelSource.resolve(str(folders["glm4_moe_lite"])))
    assert bytes_per_block(cfg, 16, torch.float32) == 3 * 16 * (32 + 8) * 4
    caches = allocate_kv_cache(cfg, 5, 4, torch.float32, torch.device("cpu"))
    k, v = caches[0]
    assert k.data_ptr() == v.data_ptr() and tuple(k.shape) == tuple(v.shape) == (5, 4, 1, 40)
    real = deepseek2_hf_config(GLM47_FLASH, "Glm4MoeLiteForCausalLM")
    per_token = bytes_per_block(real, 1, torch.bfloat16)
    assert per_token == 47 * (512 + 64) * 2  # 54,144 bytes: 52.9 KiB
    naive = 47 * 20 * ((192 + 64) + 256) * 2  # per-head K and V: 962,560 bytes
    assert naive / per_token == pytest.approx(17.78, abs=0.01)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_chunks_and_decodes_match_transformers(kind, backend, folders, references):
    """The layers' own latent attention over either backend's step metadata (a real model's
    576-dim latent row gets the torch backend: runner/kv_cache.py ``torch_for_wide_heads``;
    the tiny one's 40 dims the native one under auto)."""
    runner = runner_for(folders[kind], backend)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    run_plan(runner, references[kind], tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_prefix_hit_reads_the_latent_rows_back(kind, folders, references):
    """A second sequence on the first one's blocks (as a prefix-cache hit places it) reads
    the cached latent rows: its logits are transformers' over the whole context."""
    runner = runner_for(folders[kind], block_size=4)
    tokens = prompts(runner.config.vocab_size, (16,), seed=5)[0]
    paged = Paged([tokens, tokens + [7, 9, 11]], 4)
    runner.all_logits([paged.chunk(0, 16)])
    paged.blocks[1], paged.computed[1] = list(paged.blocks[0]), 16  # the shared 4 blocks
    (logits,) = runner.all_logits([paged.chunk(1, 3)])
    full = hf_logits(references[kind], tokens + [7, 9, 11])
    torch.testing.assert_close(logits, full[16:], atol=1e-4, rtol=0)


@needs_native
def test_either_backends_metadata_gives_the_same_sequences():
    """The latent attention reads the native backend's step metadata as the torch one's: the
    same sequences, rows, first positions and blocks (decode rows first, then chunks)."""
    from radixserve.layers.attn_backends.cpu_native import NativeCpuPagedAttention
    from radixserve.layers.attn_backends.torch_paged import TorchPagedAttention
    from radixserve.models.mla_paged import step_sequences

    table = torch.tensor([[3, 4, 0, 0], [7, 0, 0, 0], [1, 2, 5, 6]])
    q_lens, start_pos = [1, 1, 9], [6, 2, 4]
    slots = torch.arange(11)
    kwargs = {"slot_mapping": slots, "block_table": table, "q_lens": q_lens,
              "start_pos": start_pos, "block_size": 4,
              "context_lens": [p + n for p, n in zip(start_pos, q_lens)]}
    ours = [step_sequences(b().build_metadata(**kwargs))
            for b in (TorchPagedAttention, NativeCpuPagedAttention)]
    for a, b in zip(*ours):
        assert (a.q_start, a.q_len, a.start_pos) == (b.q_start, b.q_len, b.start_pos)
        n = -(-(a.start_pos + a.q_len) // 4)
        assert torch.equal(a.blocks[:n], b.blocks[:n])
    assert [(s.q_start, s.q_len, s.start_pos) for s in ours[0]] == [(0, 1, 6), (1, 1, 2),
                                                                      (2, 9, 4)]


def test_int8_pool_is_refused():
    pool = torch.zeros(2, 4, 1, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="int8 KV cache is not supported"):
        latent_attention(torch.zeros(1, 2, 8), torch.zeros(1, 8), pool, None, 1.0, 4)


def test_an_int8_kv_cache_is_refused_at_start(folders):
    with pytest.raises(ValueError, match="--kv-cache-dtype int8 is not supported"):
        LLM(str(folders["glm4_moe_lite"]), kv_cache_dtype="int8", show_progress=False)


def test_config_defaults_and_errors():
    bad = {k: v for k, v in GLM47_FLASH.items() if k != "kv_lora_rank"}
    assert deepseek2_hf_config(bad, "Glm4MoeLiteForCausalLM").mla.kv_lora_rank == 512
    with pytest.raises(ValueError, match="lacks"):
        deepseek2_hf_config({"architectures": ["DeepseekV3ForCausalLM"]}, "DeepseekV3ForCausalLM")
    v2 = {**GLM47_FLASH, "architectures": ["DeepseekV2ForCausalLM"],
          "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}
    with pytest.raises(ValueError, match="topk_method 'group_limited_greedy'"):
        deepseek2_hf_config(v2, "DeepseekV2ForCausalLM")
    with pytest.raises(ValueError, match="hidden_act"):
        deepseek2_hf_config({**GLM47_FLASH, "hidden_act": "gelu"}, "Glm4MoeLiteForCausalLM")


@pytest.mark.parametrize("kind", ["glm4_moe_lite"])  # DeepSeek-V3's shape: the runner tests
def test_llm_greedy_equals_transformers_generate(kind, folders, references):
    llm = LLM(str(folders[kind]), block_size=4, show_progress=False, max_num_batched_tokens=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    batch = prompts(llm.engine.vocab_size, (5, 22, 13), seed=11)
    for prompt, result in zip(batch, llm.generate(batch, greedy)):
        with torch.inference_mode():
            out = references[kind].generate(torch.tensor([prompt]), max_new_tokens=10,
                                            do_sample=False, eos_token_id=[])  # ignore_eos
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()


def test_mtp_layers_of_a_checkpoint_are_skipped(folders, tmp_path):
    """DeepSeek-V3 stores its multi-token-prediction layer after the decoder's: a folder
    whose config counts fewer layers loads, the extra layer's tensors left out."""
    src = folders["deepseek_v3"]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    runner = runner_for(tmp_path)
    assert len(runner.model.layers) == 2


# -- GGUF ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_config_json_and_gguf_say_the_same_model(kind, folders, gguf_files):
    """The same shape but for the floats the file stores as float32 and the name: a
    ``deepseek2`` file runs as DeepseekV3ForCausalLM (one model class serves both)."""
    hf = load_model_config(ModelSource.resolve(str(folders[kind])))
    gg = load_model_config(ModelSource.resolve(str(gguf_files[kind, "F32"])))
    assert gg.architecture == "DeepseekV3ForCausalLM"
    rounded = dataclasses.replace(
        gg, architecture=hf.architecture, rms_norm_eps=hf.rms_norm_eps,
        rope_scaling=hf.rope_scaling,
        moe=dataclasses.replace(gg.moe, routed_scaling=hf.moe.routed_scaling),
        mla=dataclasses.replace(gg.mla, softmax_scale=hf.mla.softmax_scale))
    assert rounded == hf
    assert gg.mla.softmax_scale == pytest.approx(hf.mla.softmax_scale)
    assert gg.moe.routed_scaling == pytest.approx(hf.moe.routed_scaling)
    for key, value in (hf.rope_scaling or {}).items():
        assert gg.rope_scaling[key] == (value if isinstance(value, str)
                                        else pytest.approx(value)), key


@pytest.mark.parametrize("kind", KINDS)
def test_f32_gguf_matches_transformers(kind, references, gguf_files):
    """k_b / v_b as the converter splits them (k_b transposed), joined back at load."""
    runner = runner_for(gguf_files[kind, "F32"], block_size=5)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=4)  # PLAN's lengths
    run_plan(runner, references[kind], tokens, block_size=5)


def q8_reference(kind, folder):
    """transformers' model with every matrix the Q8_0 file quantizes as it holds it (the
    router stays float32; kv_b's blocks are those of k_b transposed and of v_b)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    q8 = gguf.GGMLQuantizationType.Q8_0
    cfg = model.config
    heads, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim

    def rounded(w):
        return torch.from_numpy(gguf.quants.dequantize(quantize(w.numpy(), q8), q8))

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim < 2 or "norm" in name or name.endswith("mlp.gate.weight"):
                continue
            if name.endswith("kv_b_proj.weight"):
                kv_b = param.view(heads, -1, param.shape[-1])
                k_b = rounded(kv_b[:, :nope].transpose(1, 2).contiguous()).transpose(1, 2)
                kv_b.copy_(torch.cat((k_b, rounded(kv_b[:, nope:].contiguous())), dim=1))
            else:
                param.copy_(rounded(param))
    return model


@pytest.fixture(scope="module")
def q8_references(folders):
    return {kind: q8_reference(kind, folders[kind]) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_q8_0_gguf_dequantized_matches_transformers_on_its_weights(kind, q8_references,
                                                                   gguf_files):
    reference = q8_references[kind]
    runner = runner_for(gguf_files[kind, "Q8_0"])
    tokens = prompts(runner.config.vocab_size, (26, 12), seed=8)
    paged = Paged(tokens, 4)
    for t, logits in zip(tokens, runner.all_logits(
            [paged.chunk(i, len(t)) for i, t in enumerate(tokens)])):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=1e-4, rtol=0)


@needs_native
@pytest.mark.parametrize("kind", KINDS)
def test_q8_0_gguf_as_stored_is_close_and_batch_invariant(kind, q8_references, gguf_files):
    """The file's blocks as stored (8-bit activations in the linears): close distributions
    to transformers on the file's weights, and each sequence's logits bit-equal whether it
    runs alone or in a batch, in one chunk or several."""
    reference = q8_references[kind]
    runner = runner_for(gguf_files[kind, "Q8_0"], quantization="gguf")
    tokens = prompts(runner.config.vocab_size, (26, 12), seed=8)
    paged, batched = Paged(tokens, 4), []
    for step in ([(0, 14), (1, 5)], [(0, 11), (1, 6)], [(0, 1), (1, 1)]):
        batched += runner.all_logits([paged.chunk(i, n) for i, n in step])
    got = [torch.cat(batched[0::2]), torch.cat(batched[1::2])]
    for i, (t, logits) in enumerate(zip(tokens, got)):
        want = hf_logits(reference, t)
        log_p, log_q = torch.log_softmax(want, -1), torch.log_softmax(logits, -1)
        # 8-bit activations may flip a near-tied expert choice at a position (measured: one of
        # 38, KL 0.15, DeepSeek-V3's groups); elsewhere KL ~1e-4
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        assert kl.mean() < 0.01 and (kl < 0.01).float().mean() >= 0.9
        top2 = want.topk(2).values
        clear = (top2[:, 0] - top2[:, 1] > 0.2) & (kl < 0.01)  # 8-bit rounding cannot flip
        assert torch.equal(logits.argmax(-1)[clear], want.argmax(-1)[clear])
        alone = Paged([t], 4)  # the same sequence alone, decoded one token at a time at the end
        parts = runner.all_logits([alone.chunk(0, len(t) - 1)])
        parts += runner.all_logits([alone.chunk(0, 1)])
        assert torch.equal(torch.cat(parts)[-1], logits[-1])
