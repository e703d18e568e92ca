"""LoRA batch invariance: a row's delta is bit-identical alone and inside any batch.

Layer level: one fixed row's output of `LoraBatch.apply` alone, then with 1..40 rows of its own
adapter (the row at varying positions) beside rows of two other adapters and rows of none, at
the realistic shapes (K 576 / 2048 / 3072, rank 8 / 16 / 64). Engine level: a request's
greedy tokens and their logprobs on the tiny model (Q8_0 GGUF) alone and inside a batch of many rows of
several adapters and none.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiny_lora import make_peft_adapter
from tiny_models import hf_to_gguf, make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.layers.lora import LoraBatch

KEY = (0, "linear")


def _adapter(gen: torch.Generator, k: int, n: int, r: int) -> dict:
    return {KEY: (torch.randn(r, k, generator=gen) * 0.02, torch.randn(n, r, generator=gen) * 0.02)}


def _apply(groups: list[tuple[dict, list[int]]], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    batch = LoraBatch.build([(layers, np.array(rows)) for layers, rows in groups if rows],
                            x.shape[0], x.device)
    return batch.apply(KEY, x, y.clone())


@pytest.mark.parametrize("k", [576, 2048, 3072])
@pytest.mark.parametrize("r", [8, 16, 64])
def test_row_delta_bit_identical_in_any_group(k, r):
    gen = torch.Generator().manual_seed(k + r)
    n = 960 if k == 576 else k
    mine, other, third = (_adapter(gen, k, n, r) for _ in range(3))
    x0, y0 = torch.randn(1, k, generator=gen), torch.randn(1, n, generator=gen)
    alone = _apply([(mine, [0])], x0, y0)[0]
    assert not torch.equal(alone, y0[0])  # the adapter does something
    differs = []
    for size in range(1, 41):
        num_rows = size + 7  # 3 of `other`, 2 of `third`, 2 with no adapter
        x, y = torch.randn(num_rows, k, generator=gen), torch.randn(num_rows, n, generator=gen)
        owner = [None] * 2 + ["o"] * 3 + ["t"] * 2 + ["m"] * size
        owner = [owner[i] for i in torch.randperm(num_rows, generator=gen).tolist()]
        mine_rows = [i for i, o in enumerate(owner) if o == "m"]
        at = mine_rows[(size * 5) % size]  # the fixed row wanders through its tiles
        x[at], y[at] = x0[0], y0[0]
        groups = [(layers, [i for i, o in enumerate(owner) if o == name])
                  for layers, name in ((mine, "m"), (other, "o"), (third, "t"))]
        out = _apply(groups, x, y)
        if not torch.equal(out[at], alone):
            differs.append(size)
        for i, o in enumerate(owner):  # rows with no adapter are left alone
            if o is None:
                assert torch.equal(out[i], y[i])
    assert differs == [], f"the row's output differs from alone at group sizes {differs}"


def test_partial_adapter_leaves_its_rows_alone():
    """An adapter without this linear: its rows untouched; the others' rows as alone."""
    gen = torch.Generator().manual_seed(0)
    full = _adapter(gen, 64, 32, 8)
    x, y = torch.randn(11, 64, generator=gen), torch.randn(11, 32, generator=gen)
    out = _apply([(full, [0, 3, 4]), ({}, [1, 2, 5, 6, 7, 8, 9])], x, y)
    for i in (1, 2, 5, 6, 7, 8, 9, 10):
        assert torch.equal(out[i], y[i])
    for i in (0, 3, 4):
        assert torch.equal(out[i], _apply([(full, [0])], x[i:i + 1], y[i:i + 1])[0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_inv")
    base = make_hf_model("llama", root / "base", seed=3)
    a = make_peft_adapter(base, root / "a", seed=1)
    b = make_peft_adapter(base, root / "b", seed=2, r=4, alpha=8, targets=("q_proj", "v_proj"))
    c = make_peft_adapter(base, root / "c", seed=5, r=16)
    # Q8_0: its base layers are batch-invariant bit for bit (per-row native kernels), so any
    # difference would be LoRA's (the float32 HF layers' torch GEMMs are not)
    return hf_to_gguf(base, root / "base-q8.gguf", "Q8_0"), {"a": str(a), "b": str(b), "c": str(c)}


def test_engine_greedy_alone_equals_in_a_mixed_batch(tiny):
    """Tokens and their logprobs, bit for bit: a request alone, then inside a batch of 23
    others (adapters a, b, c and none, several on its own adapter, prompts of many lengths)."""
    base, adapters = tiny
    llm = LLM(str(base), num_kv_blocks=256, show_progress=False, enable_prefix_caching=False,
              lora_modules=adapters)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    target = [5, 17, 33, 101, 7, 250, 9, 64, 12]
    others = [[(31 * i + 7 * t) % 380 + 1 for t in range(3 + (i * 5) % 19)] for i in range(23)]
    names = (["a", "b", None, "c", "a", "a"] * 4)[:23]

    def run(prompts, loras):
        outs = llm.generate(prompts, params, lora=loras)
        return [(list(o.outputs[0].token_ids),
                 [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                for o in outs]

    for name in (None, "a", "c"):
        alone = run([target], [name])[0]
        mixed = run(others[:11] + [target] + others[11:], names[:11] + [name] + names[11:])
        assert mixed[11] == alone, name
        assert [run([p], [n])[0] for p, n in zip(others[:4], names[:4])] == mixed[:4]
