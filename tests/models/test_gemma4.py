"""Gemma 4 (text) against transformers' own ``Gemma4ForCausalLM`` in float32 (tests/
tiny_gemma4.py): the E2B layout (per-layer inputs, shared-KV layers, double-wide MLPs), the
31B one (values from the key projection, one global KV head) and the 26B-A4B MoE, through the paged pool in
shuffled blocks: packed prefills, chunked prefills, decodes mixed in one step; the pool holds
no layer for the shared-KV layers; the engine's greedy tokens = transformers' ``generate``."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from tiny_gemma4 import KINDS, make_gemma4_hf_model, text_config_fields
from transformers import AutoModelForCausalLM

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native
from radixserve.models.gemma4_config import gemma4_hf_config, gemma4_hf_name, kv_sources
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.source import ModelSource
from radixserve.runner.kv_cache import resolve_kv_dtype
from radixserve.runner.model_runner import ModelRunner

ATOL = 1e-4
# every layout on the torch attention, the E2B one (views of the pool, shared KV) on both
CASES = [(kind, "torch") for kind in KINDS] + (
    [("e2b", "cpu_native")] if native.load() is not None else [])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    return {kind: make_gemma4_hf_model(kind, root / kind, seed=5) for kind in KINDS}


@pytest.fixture(scope="module")
def references(folders):
    return {kind: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                       attn_implementation="eager").eval()
            for kind, d in folders.items()}


def runner_for(path, backend: str = "auto", block_size: int = 4,
               quantization: str = "none") -> ModelRunner:
    source = ModelSource.resolve(str(path))
    config = load_model_config(source)
    model = load_model(source, config, torch.device("cpu"), torch.float32, show_progress=False,
                       quantization=quantization)
    return ModelRunner(model, config, 64, block_size, torch.device("cpu"), torch.float32,
                       attn_backend=backend)


class Paged:
    """Sequences on blocks drawn from a shuffled pool, fed chunk by chunk."""

    def __init__(self, tokens: list[list[int]], block_size: int) -> None:
        self.pool = BlockPool(64)
        random.Random(0).shuffle(self.pool.free_queue)
        self.tokens, self.block_size = tokens, block_size
        self.computed = [0] * len(tokens)
        self.blocks: list[list[int]] = [[] for _ in tokens]

    def chunk(self, i: int, n: int) -> ScheduledSeq:
        start = self.computed[i]
        need = -(-(start + n) // self.block_size) - len(self.blocks[i])
        self.blocks[i] += self.pool.allocate(max(need, 0))
        self.computed[i] += n
        return ScheduledSeq(str(i), self.tokens[i][start:start + n], start, self.blocks[i],
                            sample=False)


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


@pytest.mark.parametrize(("kind", "backend"), CASES)
def test_logits_match_transformers_paged(folders, references, kind, backend):
    """Two sequences past the sliding window: a packed prefill of both, then chunks (one
    crossing a block and the window's edge) and decodes in mixed steps."""
    runner = runner_for(folders[kind], backend)
    rng = random.Random(1)
    tokens = [[rng.randrange(runner.config.vocab_size) for _ in range(n)] for n in (19, 14)]
    paged = Paged(tokens, 4)
    got: list[list[torch.Tensor]] = [[], []]
    for step in ([(0, 7), (1, 9)], [(0, 5), (1, 1)], [(0, 1), (1, 4)], [(0, 6)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), logits in zip(step, runner.all_logits(seqs)):
            got[i].append(logits)
    for i, toks in enumerate(tokens):
        want = hf_logits(references[kind], toks)
        assert torch.allclose(torch.cat(got[i]), want, atol=ATOL), (kind, backend, i)


def test_pool_has_no_layer_for_shared_kv_layers(folders):
    """E2B layout: 6 layers, the last 2 read layers 2 and 3's KV; the pool has 4 layers, each
    row the global layers' (2 heads of 32), the sliding layers viewing it as 4 heads of 16."""
    runner = runner_for(folders["e2b"])
    config = runner.config
    assert config.kv_source == (0, 1, 2, 3, 2, 3)
    assert config.attention_layers == (0, 1, 2, 3)
    assert config.kv_view().num_layers == 4 and len(runner.kv_caches) == 4
    assert tuple(runner.kv_caches[0][0].shape[2:]) == (2, 32)
    layers = runner.model.layers
    assert [layer.self_attn.kv_index for layer in layers] == [0, 1, 2, 3, 2, 3]
    assert not hasattr(layers[4].self_attn, "k_proj") and layers[4].mlp.up_proj.out_features == 192


def test_llm_greedy_equals_transformers_generate(folders, references):
    """The engine (scheduler, radix cache, sliding-window KV groups over the 4 pool layers):
    greedy tokens past the window = transformers' ``generate``."""
    from radixserve import LLM, SamplingParams

    llm = LLM(str(folders["e2b"]), show_progress=False)
    prompt = "the quick brown fox jumps over the lazy dog and the cache"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert len(ids) > 8  # past the window
    with torch.inference_mode():
        want = references["e2b"].generate(torch.tensor([ids]), max_new_tokens=12,
                                          do_sample=False, min_new_tokens=12)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()


def _text_config(**fields) -> dict:
    base = {"model_type": "gemma4_text", "vocab_size": 32, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 8,
            "layer_types": ["sliding_attention", "full_attention"] * 2}
    return {**base, **fields}


def test_config_of_a_release_layout_and_a_conditional_generation_folder():
    """config.json as Google's releases write it (``global_head_dim``, the global KV heads
    with ``attention_k_eq_v``), nested as a ConditionalGeneration folder's ``text_config``;
    no ``rope_parameters``: transformers' proportional rope on a quarter of 512 dims."""
    text = _text_config(global_head_dim=512, attention_k_eq_v=True,
                        num_global_key_value_heads=1, num_kv_shared_layers=2)
    cfg = gemma4_hf_config({"text_config": text, "model_type": "gemma4"},
                           "Gemma4ForConditionalGeneration")
    assert cfg.kv_shapes == ((2, 8), (1, 512), (2, 8), (1, 512))
    assert cfg.kv_source == (0, 1, 0, 1) and cfg.gemma4.k_eq_v_layers == (1, 3)
    assert cfg.widest_head_dim == 512 and cfg.kv_view().head_dim == 512
    factors = cfg.gemma4.global_rope_scaling(512)["factors"]
    assert factors[:64] == [1.0] * 64 and factors[64:] == [float("inf")] * 192
    assert resolve_kv_dtype("auto", torch.device("cpu"), torch.float32, 512) == torch.float32


def test_config_errors_and_names():
    with pytest.raises(ValueError, match="num_experts"):
        gemma4_hf_config(_text_config(enable_moe_block=True), "Gemma4ForCausalLM")
    with pytest.raises(ValueError, match="top_k_experts"):
        gemma4_hf_config(_text_config(enable_moe_block=True, num_experts=4, top_k_experts=5),
                         "Gemma4ForCausalLM")
    with pytest.raises(ValueError, match="activation"):
        gemma4_hf_config(_text_config(hidden_activation="relu"), "Gemma4ForCausalLM")
    with pytest.raises(ValueError, match="query heads"):
        gemma4_hf_config(_text_config(num_attention_heads=3), "Gemma4ForCausalLM")
    with pytest.raises(ValueError, match="no earlier layer"):
        kv_sources(["full_attention", "sliding_attention"], 1)
    assert kv_sources(["sliding_attention"] * 3 + ["full_attention"] * 2, 0) == (0, 1, 2, 3, 4)
    assert gemma4_hf_name("model.language_model.layers.0.self_attn.q_proj.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    for name in ("model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight",
                 "model.audio_tower.layers.0.norm.weight", "model.embed_vision.weight"):
        assert gemma4_hf_name(name) is None


def test_wide_heads_run_torch_attention_with_one_warning(tmp_path, caplog):
    """Global heads of 512 dims: ``auto`` picks the torch attention (logged once) where the
    native one would run, and the logits still match; cpu_native asked for: ValueError."""
    folder = make_gemma4_hf_model("31b", tmp_path / "wide", seed=2, global_head_dim=512)
    with caplog.at_level(logging.WARNING):
        runner = runner_for(folder)
    assert runner.backend_name == "torch"
    if native.load() is not None:
        assert "Gemma 4's 512-dim global layers run torch attention" in caplog.text
        with pytest.raises(ValueError, match="256"):
            runner_for(folder, "cpu_native")
    tokens = list(range(3, 15))
    got = runner.all_logits([ScheduledSeq("a", tokens, 0, list(range(3)), sample=False)])[0]
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    assert torch.allclose(got, hf_logits(ref, tokens), atol=ATOL)


@pytest.mark.parametrize("quantization", ["none", "16bit-stored"])
def test_bf16_folder_per_layer_table_is_held_in_bf16(tmp_path, quantization):
    """A bf16 checkpoint loaded as float32 (or its matrices kept 16-bit): the per-layer-input
    table stays 2 bytes a value, and the logits are transformers' on the same folder."""
    folder = make_gemma4_hf_model("e2b", tmp_path / "bf16", seed=4)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(folder)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    runner = runner_for(folder, quantization=quantization)
    table = runner.model.embed_tokens_per_layer.weight
    assert table.dtype == torch.bfloat16
    assert torch.equal(table.float(), ref.model.embed_tokens_per_layer.weight)
    tokens = list(range(3, 20))
    got = runner.all_logits([ScheduledSeq("a", tokens, 0, list(range(5)), sample=False)])[0]
    assert torch.allclose(got, hf_logits(ref, tokens), atol=ATOL)


@pytest.mark.skipif(native.load() is None, reason="16-bit as stored needs the native kernels")
def test_bf16_26b_folder_16bit_stored_holds_each_expert_as_its_matrices(tmp_path):
    """The 26B layout's bf16 folder with its matrices kept 16-bit: transformers' 3-D expert
    tensors become one pair of BF16 block linears per expert; the logits are transformers'."""
    from radixserve.layers.block_linear import BlockLinear

    folder = make_gemma4_hf_model("26b", tmp_path / "bf16", seed=4)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(folder)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    runner = runner_for(folder, quantization="16bit-stored")
    linears = [(e.gate_up_proj, e.down_proj) for layer in runner.model.layers
               for e in layer.experts]
    assert len(linears) == 4 * len(runner.model.layers)
    for linear in (m for pair in linears for m in pair):
        assert isinstance(linear, BlockLinear) and linear.types == ("BF16",), linear
    tokens = list(range(3, 20))
    got = runner.all_logits([ScheduledSeq("a", tokens, 0, list(range(5)), sample=False)])[0]
    assert torch.allclose(got, hf_logits(ref, tokens), atol=ATOL)


def test_conditional_generation_folder_runs_its_text_model(tmp_path):
    """A ``Gemma4ForConditionalGeneration`` folder (``model.language_model.*``, a vision
    tower beside it, skipped): the logits of its text model."""
    from transformers import (
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    text = Gemma4TextConfig(vocab_size=300, vocab_size_per_layer_input=300,
                            **text_config_fields("e2b"))
    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    ref = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=vision,
                                                      audio_config=None)).eval()
    ref.save_pretrained(str(tmp_path))
    runner = runner_for(tmp_path)
    assert runner.config.architecture == "Gemma4ForConditionalGeneration"
    tokens = list(range(3, 20))
    got = runner.all_logits([ScheduledSeq("a", tokens, 0, list(range(5)), sample=False)])[0]
    assert torch.allclose(got, hf_logits(ref, tokens), atol=ATOL)
