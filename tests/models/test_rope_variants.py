"""Rope scaling variants and Phi-3 against transformers: prefill logits through the paged KV
cache, and greedy decoding through the engine with a tiny KV pool, in the regime each variant
is fixed for (layers/rope_scaling.py: dynamic NTK and longrope fixed by the context length)."""

from __future__ import annotations

import json

import pytest
import torch
from test_numerics import ATOL, PagedSeqs, hf_logits, make_runner, prompts
from tiny_models import hf_to_gguf, make_hf_model
from transformers import AutoModelForCausalLM

from radixserve import LLM, SamplingParams
from radixserve.models.loader import load_model_config
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack
from radixserve.models.quantization import int8_kernels_available
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields
from radixserve.models.source import ModelSource

BLOCK = 4
# rotary dim 16 → 8 frequencies; Phi-4-mini's 0.75 of 16 → 12 dims, 6 frequencies
SHORT8 = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8]
LONG8 = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0]

LLAMA_VARIANTS = {  # (rope_scaling, max_position_embeddings, the window it makes)
    "linear": ({"rope_type": "linear", "factor": 2.0}, 64, 128),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 64, 128),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
              "beta_fast": 16.0, "beta_slow": 2.0}, 64, 256),
    "yarn-untruncated": ({"rope_type": "yarn", "factor": 3.0, "truncate": False,
                          "original_max_position_embeddings": 64, "attention_factor": 1.2},
                         64, 192),
    # longrope's max_position_embeddings is already the extended length
    "longrope": ({"rope_type": "longrope", "short_factor": SHORT8, "long_factor": LONG8,
                  "original_max_position_embeddings": 64}, 256, 256),
}


@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rope")
    return {name: make_hf_model("llama", root / name, seed=11, max_position_embeddings=max_pos,
                                rope_scaling=dict(scaling))
            for name, (scaling, max_pos, _) in LLAMA_VARIANTS.items()}


def _phi3(root, name, seed, **overrides):
    return make_hf_model("phi3", root / name, seed=seed, **overrides)


@pytest.fixture(scope="module")
def phi3_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3")
    longrope = {"rope_type": "longrope", "short_factor": SHORT8[:6], "long_factor": LONG8[:6]}
    return {
        "plain": _phi3(root, "plain", 21),
        "partial": _phi3(root, "partial", 22, partial_rotary_factor=0.75),
        # Phi-4-mini's shape: partial rotary, longrope, window 4x the original length
        "longrope": _phi3(root, "longrope", 23, partial_rotary_factor=0.75,
                          max_position_embeddings=256, original_max_position_embeddings=64,
                          rope_scaling=longrope),
    }


def _reference(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prefill_matches(path, tokens, context_len=None, split=None):
    """Our logits for ``tokens`` (in two chunks at ``split``) equal transformers' forward."""
    runner = make_runner(path, num_blocks=128)
    if context_len is not None:
        runner.model.rotary.set_context_len(context_len)
    paged = PagedSeqs([tokens], num_blocks=128)
    split = split or len(tokens) // 2
    (first,) = runner.all_logits([paged.chunk(0, split)])
    (rest,) = runner.all_logits([paged.chunk(0, len(tokens) - split)])
    torch.testing.assert_close(torch.cat([first, rest]), hf_logits(_reference(path), tokens),
                               atol=ATOL, rtol=0)


def _hf_greedy(model, prompt: list[int], num_new: int) -> list[int]:
    """transformers' greedy tokens, one full forward per step (dynamic / longrope pick their
    frequencies from each step's whole sequence, as ``generate`` does)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_new):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def _engine_greedy(path, prompt_list: list[list[int]], num_new: int, num_blocks: int,
                   quantization: str = "none") -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(path), num_kv_blocks=num_blocks, block_size=BLOCK, kv_cache_dtype="float32",
              quantization=quantization, max_num_batched_tokens=16, show_progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
    return llm, [o.outputs[0].token_ids for o in llm.generate(prompt_list, params)]


@pytest.mark.parametrize("name", ["linear", "yarn", "yarn-untruncated", "longrope"])
def test_llama_variant_prefill_past_original_length(name, llama_dirs):
    """Positions past max_position_embeddings / the original length (64) up to the window's
    end: the extrapolated bands, the attention factors, longrope's long factors."""
    path = llama_dirs[name]
    tokens = prompts(384, lengths=(min(150, LLAMA_VARIANTS[name][2]),), seed=31)[0]
    assert make_runner(path).model.rotary.context_len == LLAMA_VARIANTS[name][2]
    _prefill_matches(path, tokens)


def test_dynamic_ntk_fixed_at_the_context_length(llama_dirs):
    """Dynamic NTK at a 128-token context: transformers' base for a 128-token sequence;
    within max_position_embeddings (64): plain rope, as transformers for short sequences."""
    path = llama_dirs["dynamic"]
    assert make_runner(path).model.rotary.context_len == 128  # factor 2 x 64
    _prefill_matches(path, prompts(384, lengths=(128,), seed=32)[0], context_len=128)
    _prefill_matches(path, prompts(384, lengths=(60,), seed=33)[0], context_len=64)


def test_longrope_short_factors_within_the_original_length(llama_dirs):
    _prefill_matches(llama_dirs["longrope"], prompts(384, lengths=(60,), seed=34)[0],
                     context_len=64)


@pytest.mark.parametrize("name,num_blocks,lengths", [
    ("linear", 40, (20, 31, 7)),
    ("yarn", 64, (90, 40)),  # past the original 64
    ("dynamic", 16, (20, 9)),  # a 64-token pool: context 64, plain rope
    ("longrope", 16, (25, 12)),  # context 64: short factors
    ("longrope", 48, (100, 70)),  # context 192: long factors (all sequences are over 64)
])
def test_engine_greedy_equals_transformers(name, num_blocks, lengths, llama_dirs):
    path = llama_dirs[name]
    batch = prompts(384, lengths=lengths, seed=35)
    llm, ours = _engine_greedy(path, batch, 12, num_blocks)
    assert llm.engine.max_model_len == min(num_blocks * BLOCK, LLAMA_VARIANTS[name][2])
    reference = _reference(path)
    assert ours == [_hf_greedy(reference, p, 12) for p in batch]


@pytest.mark.parametrize("name", ["linear", "yarn"])
def test_llama_gguf_rope_scaling_keys(name, llama_dirs, tmp_path):
    """llama.cpp's rope.scaling.* keys (type, factor, original context, yarn betas): the
    F32 file's logits are transformers' on the HF folder, past the original length."""
    path = hf_to_gguf(llama_dirs[name], tmp_path / f"{name}.gguf")
    cfg = load_model_config(ModelSource.resolve(str(path)))
    assert cfg.rope_scaling["rope_type"] == name
    assert cfg.rope_scaling["factor"] == LLAMA_VARIANTS[name][0]["factor"]
    tokens = prompts(384, lengths=(120,), seed=36)[0]
    runner = make_runner(path, num_blocks=128)
    paged = PagedSeqs([tokens], num_blocks=128)
    (logits,) = runner.all_logits([paged.chunk(0, len(tokens))])
    torch.testing.assert_close(logits, hf_logits(_reference(llama_dirs[name]), tokens),
                               atol=ATOL, rtol=0)


# -- Phi-3 / Phi-4 --------------------------------------------------------------------------

def test_phi3_config(phi3_dirs):
    plain = load_model_config(ModelSource.resolve(str(phi3_dirs["plain"])))
    assert plain.architecture == "Phi3ForCausalLM" and plain.rotary_dim is None
    cfg = load_model_config(ModelSource.resolve(str(phi3_dirs["longrope"])))
    assert cfg.rotary_dim == 12 and cfg.max_position_embeddings == 256
    assert cfg.rope_scaling["rope_type"] == "longrope"
    assert cfg.rope_scaling["original_max_position_embeddings"] == 64
    assert cfg.sliding_window is None


def test_phi3_sliding_window_is_read_and_applied(tmp_path):
    """Phi-3-mini-4k's sliding_window (2047 of 4096 there): read from config.json and GGUF,
    applied by the attention (a prompt past the window equals transformers), and the context
    is not cut to it."""
    path = _phi3(tmp_path, "swa", 24, sliding_window=48)
    assert load_model_config(ModelSource.resolve(str(path))).sliding_window == 48
    gguf = hf_to_gguf(path, tmp_path / "swa.gguf")
    assert load_model_config(ModelSource.resolve(str(gguf))).sliding_window == 48
    _prefill_matches(path, prompts(384, lengths=(90,), seed=44)[0], split=53)
    llm = LLM(str(path), num_kv_blocks=64, block_size=BLOCK, show_progress=False)
    assert llm.engine.max_model_len > 48


@pytest.mark.parametrize("name", ["plain", "partial", "longrope"])
def test_phi3_prefill_matches_transformers(name, phi3_dirs):
    """40 tokens; longrope in a 64-token context (the original length): short factors."""
    tokens = prompts(384, lengths=(40,), seed=41)[0]
    _prefill_matches(phi3_dirs[name], tokens, context_len=64 if name == "longrope" else None,
                     split=17)


def test_phi3_longrope_long_factors(phi3_dirs):
    tokens = prompts(384, lengths=(150,), seed=42)[0]
    _prefill_matches(phi3_dirs["longrope"], tokens, split=70)


@pytest.mark.parametrize("name,num_blocks,lengths", [
    ("plain", 24, (30, 11)),
    ("partial", 24, (30, 11)),
    ("longrope", 16, (30, 9)),  # context 64: short factors
    ("longrope", 64, (90, 75)),  # context 256: long factors
])
def test_phi3_engine_greedy_equals_transformers(name, num_blocks, lengths, phi3_dirs):
    batch = prompts(384, lengths=lengths, seed=43)
    _, ours = _engine_greedy(phi3_dirs[name], batch, 10, num_blocks)
    reference = _reference(phi3_dirs[name])
    assert ours == [_hf_greedy(reference, p, 10) for p in batch]


@pytest.mark.skipif(not int8_kernels_available(), reason="int8 needs the native kernels")
@pytest.mark.parametrize("name,native", [("plain", True), ("partial", False)])
def test_phi3_layer_stack(name, native, phi3_dirs):
    """Whole-head rope takes the one-call-per-layer native stack; partial rotary the Python
    layers (the native layer rotates whole heads)."""
    llm, _ = _engine_greedy(phi3_dirs[name], prompts(384, lengths=(9,), seed=44), 2, 8,
                            quantization="int8")
    stack = llm.engine.runner.model._stack
    assert isinstance(stack, NativeLayerStack if native else PythonLayerStack)


@pytest.fixture(scope="module")
def phi3_gguf(phi3_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3_gguf")
    return {ftype: hf_to_gguf(phi3_dirs["longrope"], root / ftype / "phi3.gguf", ftype)
            for ftype in ("F32", "Q8_0")}


def test_phi3_gguf_config(phi3_gguf, phi3_dirs):
    gguf_cfg = load_model_config(ModelSource.resolve(str(phi3_gguf["F32"])))
    hf_cfg = load_model_config(ModelSource.resolve(str(phi3_dirs["longrope"])))
    assert gguf_cfg.architecture == "Phi3ForCausalLM"
    assert gguf_cfg.rotary_dim == hf_cfg.rotary_dim == 12
    gguf_rope, hf_rope = gguf_cfg.rope_scaling, hf_cfg.rope_scaling
    assert gguf_rope["original_max_position_embeddings"] == 64
    assert gguf_rope["long_factor"] == pytest.approx(hf_rope["long_factor"])
    assert gguf_rope["short_factor"] == pytest.approx(hf_rope["short_factor"])
    assert gguf_cfg.sliding_window is None


@pytest.mark.parametrize("length,split,context_len", [(40, 17, 64), (150, 70, 256)])
def test_phi3_f32_gguf_equals_original_model(length, split, context_len, phi3_gguf,
                                             phi3_dirs):
    """attn_qkv and ffn_up (gate and up stacked) as stored, the rope factor tensors and
    llama.cpp's attention factor: the same logits as transformers on the HF folder (short
    factors in a 64-token context, long ones in the whole window)."""
    tokens = prompts(384, lengths=(length,), seed=45)[0]
    runner = make_runner(phi3_gguf["F32"], num_blocks=128)
    runner.model.rotary.set_context_len(context_len)
    paged = PagedSeqs([tokens], num_blocks=128)
    (first,) = runner.all_logits([paged.chunk(0, split)])
    (rest,) = runner.all_logits([paged.chunk(0, length - split)])
    torch.testing.assert_close(torch.cat([first, rest]),
                               hf_logits(_reference(phi3_dirs["longrope"]), tokens),
                               atol=ATOL, rtol=0)


@pytest.mark.skipif(not int8_kernels_available(), reason="GGUF blocks need the native kernels")
def test_phi3_q8_gguf_as_stored(phi3_gguf):
    """The fused matrices kept as the file's Q8_0 blocks: the float model of the dequantized
    file's logits, to the 8-bit activations' rounding (a misplaced shard is off by O(1))."""
    tokens = prompts(384, lengths=(30,), seed=46)[0]
    stored = make_runner(phi3_gguf["Q8_0"], quantization="gguf")
    floats = make_runner(phi3_gguf["Q8_0"])
    ours = [r.all_logits([PagedSeqs([tokens]).chunk(0, len(tokens))])[0]
            for r in (stored, floats)]
    assert (ours[0] - ours[1]).abs().max() < 0.02 * ours[1].abs().max()
    assert (ours[0].argmax(-1) == ours[1].argmax(-1)).float().mean() > 0.9


@pytest.mark.skipif(not int8_kernels_available(), reason="GGUF blocks need the native kernels")
def test_phi3_stored_native_stack_equals_python_layers(phi3_dirs, tmp_path):
    """Whole-head Phi-3 from a Q4_0 file: the native layer stack on the stored fused
    matrices gives the Python layers' bits."""
    runner = make_runner(hf_to_gguf(phi3_dirs["plain"], tmp_path / "p.gguf", "Q4_0"),
                         quantization="gguf")
    tokens = prompts(384, lengths=(12, 7), seed=48)

    def steps():
        paged, out = PagedSeqs(tokens), []
        for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
            out += runner.all_logits([paged.chunk(i, n) for i, n in step])
        return out

    native_out = steps()
    assert isinstance(runner.model._stack, NativeLayerStack)
    runner.model._stack = PythonLayerStack(runner.model.layers)
    assert all(torch.equal(a, b) for a, b in zip(native_out, steps()))


# -- bad configs ----------------------------------------------------------------------------

def test_positions_past_the_tables_are_refused(llama_dirs):
    runner = make_runner(llama_dirs["linear"])
    runner.model.rotary.set_context_len(32)
    paged = PagedSeqs([prompts(384, lengths=(40,), seed=47)[0]])
    with pytest.raises(ValueError, match="position 39 is past the rope tables' context"):
        runner.all_logits([paged.chunk(0, 40)])


def test_unknown_rope_type_names_the_supported(tmp_path):
    path = make_hf_model("llama", tmp_path / "m", seed=1)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_scaling"] = {"rope_type": "wobbly", "factor": 2.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="wobbly.*supported.*'linear'.*'dynamic'.*'yarn'"
                                         ".*'longrope'.*'llama3'"):
        load_model_config(ModelSource.resolve(str(path)))


def test_unknown_gguf_rope_type_names_the_supported():
    fields = {"llama.rope.scaling.type": "wobbly"}
    with pytest.raises(ValueError, match="'wobbly'; supported: none, linear, yarn, longrope"):
        gguf_rope_fields(lambda key, default=None: fields.get(key, default), {}, "llama", 16,
                         64)


def test_transformers_v4_phi3_config():
    """Phi-3-mini-128k / Phi-4-mini as on the hub: ``rope_scaling`` with the old ``su`` name
    (or ``longrope``), the original length and partial_rotary_factor at the top level."""
    cfg = {"hidden_size": 3072, "num_attention_heads": 24, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
           "partial_rotary_factor": 0.75,
           "rope_scaling": {"type": "su", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    fields = hf_rope_fields(cfg, "Phi3ForCausalLM")
    assert fields["rotary_dim"] == 96 and fields["rope_theta"] == 10000.0
    assert fields["rope_scaling"]["rope_type"] == "longrope"
    assert fields["rope_scaling"]["original_max_position_embeddings"] == 4096
    # transformers' Phi3Config defaults the original length to 4096
    del cfg["original_max_position_embeddings"]
    scaling = hf_rope_fields(cfg, "Phi3ForCausalLM")["rope_scaling"]
    assert scaling["original_max_position_embeddings"] == 4096


@pytest.mark.parametrize("scaling,max_pos,partial,seq_len", [
    ({"rope_type": "linear", "factor": 3.0}, 64, 1.0, None),
    ({"rope_type": "dynamic", "factor": 2.0}, 64, 0.5, 100),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
      "mscale": 0.707, "mscale_all_dim": 1.0}, 256, 1.0, None),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
      "beta_fast": 8.0, "beta_slow": 0.5}, 64, 0.75, None),
    ({"rope_type": "longrope", "short_factor": SHORT8[:4], "long_factor": LONG8[:4],
      "original_max_position_embeddings": 64}, 512, 0.5, 64),
    ({"rope_type": "longrope", "short_factor": SHORT8[:4], "long_factor": LONG8[:4],
      "original_max_position_embeddings": 64, "attention_factor": 1.3}, 512, 0.5, 65),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, 512, 1.0, None),
], ids=["linear", "dynamic-partial", "yarn-mscale", "yarn-betas-partial", "longrope-short",
        "longrope-long", "llama3"])
def test_frequencies_equal_transformers_init_functions(scaling, max_pos, partial, seq_len):
    """Our inverse frequencies and attention factor against transformers'
    ROPE_INIT_FUNCTIONS for a sequence of the context length we fix them for (None: its
    default, max_position_embeddings)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from radixserve.layers.rope_scaling import normalize_rope_scaling, rope_frequencies

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                         max_position_embeddings=max_pos,
                         rope_parameters={**scaling, "rope_theta": 10000.0,
                                          "partial_rotary_factor": partial})
    theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, seq_len=seq_len)
    ours, our_factor = rope_frequencies(int(16 * partial), 10000.0,
                                        normalize_rope_scaling(dict(scaling), max_pos),
                                        max_pos, seq_len or max_pos)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(their_factor, rel=1e-7)
