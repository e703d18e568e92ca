"""KV blocks released out of the window, through the engine (core/kv/kv_groups.py): a tiny
Gemma 3 (5 sliding layers of window 8 and a global one: two KV groups) and a tiny Mistral
(every layer sliding: one group), blocks of 4, sequences several windows long. Greedy tokens
equal transformers' own generation batched, chunked across the window's edge, preempted and
from prefix-cache hits (some cut back because the window before them was released), on both
attention backends; a sequence's sliding pages stay bounded while its global ones grow."""

from __future__ import annotations

import random

import pytest
import torch
from test_llm_embedded import swapped_scheduler, token_ids
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.layers.attn_backends import get_attn_backend

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
LENGTHS = (37, 9, 26, 50)


@pytest.fixture(scope="module", params=["gemma3", "mistral"])
def case(request, tmp_path_factory):
    """(llm, prompts, transformers' greedy tokens for them)."""
    from transformers import AutoModelForCausalLM

    path = make_hf_model(request.param, tmp_path_factory.mktemp(request.param), seed=5)
    # a float32 pool: the torch backend (swapped in below) reads the model's dtype only
    llm = LLM(str(path), block_size=4, kv_cache_dtype="float32", show_progress=False)
    rng = random.Random(3)
    prompts = [[rng.randrange(llm.engine.vocab_size) for _ in range(n)] for n in LENGTHS]
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = []
    for p in prompts:
        with torch.inference_mode():
            out = reference.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False,
                                     min_new_tokens=24)
        expected.append(out[0, len(p):].tolist())
    return llm, prompts, expected


class torch_backend:
    """Run the engine's runner on the reference torch attention (whole blocks gathered and
    masked: the null block's slots are read there, and must not matter)."""

    def __init__(self, llm):
        self.runner = llm.engine.runner

    def __enter__(self):
        self.old = self.runner.backend
        self.runner.backend = get_attn_backend("torch")

    def __exit__(self, *exc):
        self.runner.backend = self.old


def held_pages(llm):
    """Spy on the KV manager: per request, the most sliding pages held after each step's
    allocation once its prompt is computed."""
    kv = llm.engine.scheduler.kv
    g, group = kv._sliding[-1]
    null, most = kv.block_pool.null_block, {}
    original = kv.allocate_slots

    def spy(request, num_new):
        ok = original(request, num_new)
        if ok and request.num_computed_tokens >= request.num_prompt_tokens:
            table = kv.tables(request)[g]
            pages = sum(b != null for b in table[::group.units_per_page])
            most[request.request_id] = max(most.get(request.request_id, 0), pages)
        return ok

    kv.allocate_slots = spy
    return most


def poison_null_block(llm, value: float) -> None:
    """Fill the null block's rows of every K/V tensor with ``value``."""
    null = llm.engine.scheduler.kv.block_pool.null_block
    for k, v in {id(kv): kv for kv in llm.engine.runner.kv_caches}.values():
        k[null] = value
        v[null] = value


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_batch_equals_transformers_and_sliding_pages_stay_bounded(case, backend):
    llm, prompts, expected = case
    kv = llm.engine.scheduler.kv
    assert kv.block_pool.null_block is not None
    most = held_pages(llm)
    # the null block is never read by the native kernel (NaN would show), and read but
    # masked out by the torch backend's whole-block gathers (large garbage must not matter)
    native = backend == "auto" and llm.engine.runner.backend.name == "cpu_native"
    poison_null_block(llm, float("nan") if native else 1e4)
    try:
        if backend == "torch":
            with torch_backend(llm):
                got = token_ids(llm.generate(prompts, GREEDY))
        else:
            got = token_ids(llm.generate(prompts, GREEDY))
    finally:
        del kv.allocate_slots
        poison_null_block(llm, 0.0)
    assert got == expected
    # decoding, a query at p reads keys p-7..p (and with a draft of k tokens, queries up to
    # p+k): 8 + k consecutive positions, on pages of 4: 3 pages at most, 4 with drafts
    spec = llm.engine.scheduler.spec
    span = 8 + (spec.policy.k_max if spec.enabled else 0)
    assert most and max(most.values()) <= (span + 2) // 4 + 1
    llm.engine.scheduler.check_integrity()


def test_chunked_across_the_window_equals_transformers(case):
    llm, prompts, expected = case
    with swapped_scheduler(llm, max_num_batched_tokens=5) as s:
        assert token_ids(llm.generate(prompts, GREEDY)) == expected
        s.check_integrity()


def test_preempted_equals_transformers(case):
    llm, prompts, expected = case
    kv = llm.engine.scheduler.kv
    # one sequence fits (74 tokens fed 6 a step), the four together do not
    need = kv.units_held(50 + 24, 6)
    with swapped_scheduler(llm, num_blocks=need + 4, max_num_batched_tokens=6) as s:
        preempted = []
        original = s._preempt
        s._preempt = lambda r: (preempted.append(r.request_id), original(r))
        assert token_ids(llm.generate(prompts, GREEDY)) == expected
        assert preempted, "the small pool should have forced preemption"
        assert s.kv.block_pool.num_free_blocks == need + 3  # all but the null block
        s.check_integrity()


def test_prefix_hits_with_released_windows_equal_cold_runs(case):
    llm, prompts, _ = case
    scheduler = llm.engine.scheduler
    scheduler.kv.prefix_cache.evict(10**9)
    llm.generate(prompts, GREEDY)  # each generated 24 tokens: 3 windows past its prompt
    rng = random.Random(9)
    # the same prompts again (their own hit points kept their windows), each extended (their
    # last prompt pages were released: the hit falls back), and each with its whole answer
    longer = [p + [rng.randrange(llm.engine.vocab_size) for _ in range(6)] for p in prompts]
    again = [r.prompt_token_ids + r.outputs[0].token_ids for r in llm.generate(prompts, GREEDY)]
    followups = prompts + longer + [a + [5, 6, 7] for a in again]
    with swapped_scheduler(llm):  # NoPrefixCache: a cold reference
        cold = token_ids(llm.generate(followups, GREEDY))
    scheduler.kv.prefix_cache.evict(10**9)
    llm.generate(prompts, GREEDY)
    hot = llm.generate(followups, GREEDY)
    assert token_ids(hot) == cold
    cached = [r.num_cached_tokens for r in hot]
    n = len(prompts)
    assert cached[:n] == [(len(p) - 1) // 4 * 4 for p in prompts]
    assert all(0 < c < (len(p) - 1) // 4 * 4 for c, p in zip(cached[n:2 * n], longer))
    assert all(c >= len(a) - 8 for c, a in zip(cached[2 * n:], again))
    scheduler.check_integrity()
