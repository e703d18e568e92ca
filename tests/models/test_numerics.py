"""Our model's logits against Hugging Face transformers, through the paged KV cache."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import load_gguf_model, make_hf_model
from transformers import AutoConfig, AutoModelForCausalLM

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.sched_output import ScheduledSeq
from radixserve.layers.int8_linear import Int8Linear, quantize_weight
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.quantization import int8_kernels_available
from radixserve.models.source import ModelSource
from radixserve.runner.model_runner import ModelRunner

ATOL = 1e-4
INT8_ATOL = 2e-3  # two-term int8 activations: ~15 bits per row
BLOCK_SIZE = 4


def make_runner(path, num_blocks=64, quantization="none") -> ModelRunner:
    source = ModelSource.resolve(str(path))
    config = load_model_config(source)
    model = load_model(source, config, torch.device("cpu"), torch.float32, show_progress=False,
                       quantization=quantization)
    return ModelRunner(model, config, num_blocks, BLOCK_SIZE, torch.device("cpu"),
                       torch.float32)


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


class PagedSeqs:
    """Sequences with block tables drawn from a shuffled pool, fed chunk by chunk."""

    def __init__(self, token_lists: list[list[int]], num_blocks: int = 64, seed: int = 0):
        self.pool = BlockPool(num_blocks)
        random.Random(seed).shuffle(self.pool.free_queue)
        self.tokens = token_lists
        self.computed = [0] * len(token_lists)
        self.blocks: list[list[int]] = [[] for _ in token_lists]

    def chunk(self, i: int, n: int) -> ScheduledSeq:
        start = self.computed[i]
        need = -(-(start + n) // BLOCK_SIZE) - len(self.blocks[i])
        self.blocks[i] += self.pool.allocate(max(need, 0))
        self.computed[i] += n
        return ScheduledSeq(str(i), self.tokens[i][start:start + n], start, self.blocks[i],
                            sample=False)


@pytest.fixture(scope="module")
def hf_models(tiny_hf_dirs):
    return {arch: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            for arch, d in tiny_hf_dirs.items()}


def prompts(vocab: int, lengths=(5, 13, 1, 9), seed=1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_packed_prefill_matches_transformers(arch, tiny_hf_dirs, hf_models):
    runner = make_runner(tiny_hf_dirs[arch])
    tokens = prompts(runner.config.vocab_size)
    paged = PagedSeqs(tokens)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(hf_models[arch], t), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_chunked_prefill_and_decode_steps_match_transformers(arch, tiny_hf_dirs, hf_models):
    """Mixed batches: prefill chunks of some sequences beside one-token decodes of others."""
    runner = make_runner(tiny_hf_dirs[arch])
    tokens = prompts(runner.config.vocab_size, lengths=(22, 17, 9), seed=2)
    paged = PagedSeqs(tokens, seed=3)
    # (sequence, tokens this step) per step; sequences advance at different paces
    plan = [[(0, 6), (1, 1)], [(0, 5), (1, 7), (2, 1)], [(0, 1), (1, 1), (2, 4)],
            [(0, 1), (2, 1), (1, 8)], [(0, 9), (2, 3)]]
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(hf_models[arch], tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)
    assert paged.computed == [len(t) for t in tokens]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("ftype", ["F32", "F16", "Q8_0", "Q4_0"])
def test_gguf_matches_transformers(arch, ftype, tiny_hf_dirs, tiny_gguf_files):
    """GGUF names, llama.cpp's Q/K permutation and dequantization, against transformers'
    own GGUF loading of the same file (the same dequantized weights)."""
    path = tiny_gguf_files(arch, ftype)
    config = AutoConfig.from_pretrained(tiny_hf_dirs[arch]) if arch == "qwen3" else None
    reference = load_gguf_model(path, config)
    runner = make_runner(path)
    tokens = prompts(runner.config.vocab_size, seed=4)
    paged = PagedSeqs(tokens)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


def test_f32_gguf_equals_original_model(tiny_gguf_files, hf_models):
    runner = make_runner(tiny_gguf_files("llama", "F32"))
    t = prompts(runner.config.vocab_size, lengths=(11,))[0]
    paged = PagedSeqs([t])
    (logits,) = runner.all_logits([paged.chunk(0, len(t))])
    torch.testing.assert_close(logits, hf_logits(hf_models["llama"], t), atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    {"tie_word_embeddings": True},
], ids=["llama3-rope", "tied"])
def test_llama_variants(overrides, tmp_path):
    path = make_hf_model("llama", tmp_path / "m", seed=5, **overrides)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = make_runner(path, num_blocks=128)
    t = prompts(runner.config.vocab_size, lengths=(200,), seed=6)[0]
    paged = PagedSeqs([t], num_blocks=128)
    (first,) = runner.all_logits([paged.chunk(0, 150)])
    (rest,) = runner.all_logits([paged.chunk(0, 50)])
    torch.testing.assert_close(torch.cat([first, rest]), hf_logits(reference, t),
                               atol=ATOL, rtol=0)


def _round_weights_as_int8_(model: torch.nn.Module) -> None:
    """Float model with the weights `quantize_linears_` would compute with (and a head of its
    own when tied), so only the int8 path's activation rounding differs."""
    def rounded(w):
        q, scale = quantize_weight(w)
        return q.float() * scale[:, None]
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = rounded(module.weight.data)
    if model.lm_head is None:
        emb = model.embed_tokens.weight
        model.lm_head = torch.nn.Linear(emb.shape[1], emb.shape[0], bias=False)
        model.lm_head.weight.data = rounded(emb.data)


@pytest.mark.skipif(not int8_kernels_available(), reason="int8 needs the native kernels")
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_int8_model_matches_its_dequantized_weights(arch, tiny_gguf_files):
    """The quantized path's tolerance test: int8 linears (two-term activations) against the
    float model holding the same rounded weights, chunked prefill and decode steps."""
    path = tiny_gguf_files(arch, "Q8_0")
    int8, ref = make_runner(path, quantization="int8"), make_runner(path)
    assert isinstance(int8.model.layers[0].mlp.down_proj, Int8Linear)
    _round_weights_as_int8_(ref.model)
    tokens = prompts(int8.config.vocab_size, lengths=(12, 7), seed=7)
    paged = {"int8": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
        ours = int8.all_logits([paged["int8"].chunk(i, n) for i, n in step])
        theirs = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=INT8_ATOL, rtol=0)
