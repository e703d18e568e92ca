"""Gemma 3 270M (Q4_K_M GGUF, 18 layers, sliding window 512) in the default mode — the file's
blocks as stored — against transformers in float32 on the same file.

The weights are the same numbers on both sides (transformers dequantizes the file); what
differs is radixserve's 8-bit activations in the block linears and its float16 KV pool. So the
greedy tokens are compared over each prompt's safe-margin prefix: the steps before the first one
where transformers' top-2 logit margin falls under ``MARGIN`` (where that rounding could
legitimately flip the choice). One prompt is over 512 tokens, so the sliding layers' window
matters. Token ids come from transformers' tokenizer of the same file.

The same file in float (dequantized weights, float32 KV) must give transformers' logits to
float rounding. One GGUFReader (the session's: real_models.one_reader) serves transformers'
config, tokenizer and weights and both engines.
"""

from __future__ import annotations

import os

import pytest
import torch

from radixserve import SamplingParams
from radixserve.config import engine_config
from radixserve.core.sched_output import ScheduledSeq, SchedulerOutput
from radixserve.engine.build import build_engine_core
from radixserve.engine.engine_core import EngineCore
from radixserve.messages import EngineCoreRequest
from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.source import ModelSource

real_models = pytest.importorskip("real_models")

# logits; |ours - transformers| measured on these prompts' positions: 0.1-0.15 mean, top-1
# agreement 0.997 (the long prompt), 1.0 (the others)
MARGIN = 0.5
NUM_TOKENS = 24
TAIL = 40  # positions whose full-vocabulary logits the float test compares
_PARAGRAPH = (
    "The paged KV cache splits every sequence's keys and values into fixed-size blocks, so "
    "memory is handed out a block at a time and shared prefixes are stored once. A radix tree "
    "over token ids finds the longest cached prefix of a new prompt; blocks nobody holds are "
    "evicted least recently used first.")
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "One, two, three, four, five,",
    "".join(f"Section {i}. {_PARAGRAPH}\n" for i in range(1, 11)) + "Section 11.",
]


def _margins_and_tokens(model, ids: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``ids`` and each step's top-2 logit margin."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                             min_new_tokens=NUM_TOKENS, output_logits=True,
                             return_dict_in_generate=True)
    top2 = [step[0].float().topk(2).values for step in out.logits]
    return out.sequences[0, len(ids):].tolist(), [float(t[0] - t[1]) for t in top2]


@pytest.fixture(scope="module")
def reference():
    """(the open reader, each prompt's ids, transformers' model, its greedy tokens and
    margins per prompt): one transformers load for the module."""
    from tiny_models import load_gguf_model
    from transformers import AutoTokenizer

    path = real_models.gemma3_270m()
    folder, name = os.path.split(path)
    with real_models.one_reader(path) as reader:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = load_gguf_model(path)
    assert model.config.sliding_window == 512
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    assert len(ids[-1]) > 600
    return reader, ids, model, [_margins_and_tokens(model, i) for i in ids]


def _engine(reader, **options) -> EngineCore:
    path = real_models.gemma3_270m()
    return build_engine_core(engine_config(path, **options), ModelSource.resolve(path), False,
                             reader)


def _greedy(engine: EngineCore, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    for n, prompt in enumerate(prompts):
        engine.add_request(EngineCoreRequest(request_id=str(n), prompt_token_ids=prompt,
                                             sampling_params=params))
    out: dict[str, list[int]] = {str(n): [] for n in range(len(prompts))}
    while engine.has_unfinished_requests():
        for o in engine.step().outputs:
            out[o.request_id] += o.new_token_ids
    return [out[str(n)] for n in range(len(prompts))]


def _safe_len(margins: list[float]) -> int:
    return next((k for k, m in enumerate(margins) if m < MARGIN), len(margins))


@pytest.mark.skipif(native.load() is None, reason="blocks as stored need the native kernels")
def test_gemma3_270m_as_stored_greedy_matches_transformers_over_the_safe_margin_prefix(
        reference):
    reader, ids, _, expected = reference
    engine = _engine(reader)
    model = engine.runner.model
    assert isinstance(model.layers[0].self_attn.qkv_proj, BlockLinear)
    assert [model.config.layer_window(i) for i in range(6)] == [512] * 5 + [None]
    compared = 0
    for prompt, ours, (theirs, margins) in zip(ids, _greedy(engine, ids), expected):
        safe = _safe_len(margins)
        assert ours[:safe] == theirs[:safe], (len(prompt), safe, ours, theirs)
        compared += safe
    # the comparison must cover real ground: the long prompt's whole continuation and more
    assert _safe_len(expected[-1][1]) == NUM_TOKENS and compared >= NUM_TOKENS + 8


def test_gemma3_270m_float_logits_equal_transformers(reference):
    """The same file dequantized to float32 weights and a float32 KV pool: the logits of each
    prompt's last TAIL positions — fed as a chunk after the rest of the prompt, so the long
    prompt's tail reads its window from the pool — within float rounding (measured 1.2e-4 at
    most over every position, on logits of magnitude ~30)."""
    reader, ids, model, _ = reference
    engine = _engine(reader, quantization="none", kv_cache_dtype="float32")
    runner, kv = engine.runner, engine.scheduler.kv
    pool = kv.block_pool
    for prompt in ids:
        tail = min(TAIL, len(prompt) - 1)
        pages = -(-len(prompt) // runner.block_size)
        # a table per KV group (global, sliding: core/kv/kv_groups.py), nothing released
        tables = [pool.allocate(pages * g.units_per_page) for g in kv.groups.groups]
        try:
            head = ScheduledSeq("head", prompt[:-tail], 0, tables[0], sample=False,
                                window_block_ids=tables[1:])
            runner.execute(SchedulerOutput([head], head.num_tokens, []))  # K/V only, no logits
            rest = ScheduledSeq("tail", prompt[-tail:], len(prompt) - tail, tables[0],
                                sample=False, window_block_ids=tables[1:])
            (ours,) = runner.all_logits([rest])
        finally:
            for table in tables:
                pool.free(table)
        with torch.inference_mode():
            want = model(torch.tensor([prompt]), logits_to_keep=tail).logits[0]
        torch.testing.assert_close(ours, want, atol=1e-3, rtol=0)
