"""The ngram and suffix proposers on plain token lists; the suffix tree's memory bound; the
adaptive policy's draft lengths."""

from __future__ import annotations

import random

import pytest

from radixserve.spec.factory import make_proposer
from radixserve.spec.policy import SpecPolicy, SpecState, evidence_key
from radixserve.spec.proposer import NO_DRAFT, OTHER_OUTPUTS, Draft
from radixserve.spec.suffix import SuffixProposer, SuffixTree


def test_ngram_latest_longest_match_and_incremental():
    p = make_proposer("ngram")
    ctx = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3]
    assert p.propose("a", ctx, 5, 3) == Draft([4, 5, 7], 3)  # the latest occurrence of 1 2 3
    ctx += [4]
    assert p.propose("a", ctx, 5, 2) == Draft([5, 7], 4)
    assert p.propose("c", [8, 8, 6, 8], 4, 2) == Draft([6, 8], 1)  # the latest 8 with a successor
    assert p.propose("b", [5, 6, 7], 3, 4) == NO_DRAFT
    p.on_finished("a", ctx, 5)
    assert "a" not in p._index


def test_ngram_evidence_follows_the_match_back_past_the_ngram():
    p = make_proposer("ngram")
    quote = list(range(100, 120))
    ctx = [1, 2] + quote + [3, 4] + quote[:12]  # the answer quotes 12 tokens so far
    assert p.propose("a", ctx, 24, 4) == Draft(quote[12:16], 12)
    assert p.propose("b", [5] * 40, 40, 4) == Draft([5], 16)  # at most 16 compared


def test_suffix_own_context_and_other_requests_outputs():
    p = make_proposer("suffix")
    assert p.propose("a", [1, 2, 3, 4, 1, 2], 6, 2) == Draft([3, 4], 2)
    p.on_finished("a", [1, 2, 3, 4, 1, 2, 3, 4], 6)
    p.on_finished("b", [9, 9, 50, 51, 52, 53, 54], 2)  # an output another request may repeat
    assert p.propose("c", [7, 50, 51], 3, 3) == Draft([52, 53, 54], 2, OTHER_OUTPUTS)
    assert p.propose("c", [7, 50, 51, 52, 53, 54], 3, 3).tokens == []  # nothing followed it
    # the request's own context wins where its match is as long as the outputs' one
    assert p.propose("d", [50, 51, 60, 7, 50, 51], 6, 2) == Draft([60, 7], 2)
    assert p.propose("e", [51, 60, 7, 50, 51], 5, 2) == Draft([52, 53], 2, OTHER_OUTPUTS)


def test_suffix_picks_the_source_whose_evidence_was_accepted_more():
    policy = SpecPolicy(k_max=4)
    p = make_proposer("suffix", acceptance=policy.table)
    p.on_finished("b", [9, 1, 2, 3, 50, 51], 1)
    ctx = [7, 3, 60, 1, 2, 3]  # own: 3 -> 60 (1 token); other outputs: 1 2 3 -> 50 (3)
    assert p.propose("a", ctx, 6, 2) == Draft([50, 51], 3, OTHER_OUTPUTS)
    for _ in range(50):  # other requests' outputs turned out to predict this workload badly
        policy.record(4, 0, evidence_key(3, False, OTHER_OUTPUTS))
    assert p.propose("a", ctx, 6, 2) == Draft([60, 1], 1)


def test_suffix_tree_match_is_the_longest_tail_with_a_continuation():
    rng = random.Random(0)
    for _ in range(200):
        tree = SuffixTree(depth=rng.randint(2, 8))
        outputs = [[rng.randint(0, 3) for _ in range(rng.randint(2, 12))] for _ in range(3)]
        for out in outputs:
            tree.add(out)
        context = [rng.randint(0, 3) for _ in range(rng.randint(1, 10))]
        m, node = tree.match(context, max_match=6)
        best = 0  # brute force: the longest tail followed by a token in some output
        for n in range(1, min(6, len(context), tree.depth - 1) + 1):
            tail = context[-n:]
            if any(out[i:i + n] == tail and i + n < len(out) and n < tree.depth
                   for out in outputs for i in range(len(out))):
                best = n
        assert m == best, (context, outputs, tree.depth)
        assert (node is None) == (best == 0)


def test_suffix_tree_counts_every_substring_through_adds_and_removes():
    """The flat tree against a plain count of substrings (length <= depth) of the sequences
    currently in it, after random adds and removes (freed node ids are reused)."""
    rng = random.Random(1)
    for _ in range(30):
        depth, tree, held = rng.randint(2, 6), None, []
        tree = SuffixTree(depth)
        for _ in range(12):
            if held and rng.random() < 0.4:
                tree.remove(held.pop(rng.randrange(len(held))))
            else:
                seq = [rng.randint(0, 3) for _ in range(rng.randint(1, 9))]
                tree.add(seq)
                held.append(seq)
            want: dict[tuple[int, ...], int] = {}
            for seq in held:
                for i in range(len(seq)):
                    for n in range(1, min(depth, len(seq) - i) + 1):
                        key = tuple(seq[i:i + n])
                        want[key] = want.get(key, 0) + 1
            got, stack = {}, [((), 0)]
            while stack:
                path, node = stack.pop()
                children = tree.children(node)
                for token, child in children.items():
                    got[path + (token,)] = tree._count[child]
                    stack.append((path + (token,), child))
                if children and node:  # the draft follows a most frequent child
                    [token] = tree.follow(node, 1, 0.0)
                    top = max(tree._count[c] for c in children.values())
                    assert tree._count[children[token]] == top
            assert got == want
            assert tree.num_nodes == len(want) + 1


def test_suffix_tree_is_bounded_and_remove_undoes_add():
    t = SuffixTree(depth=6)
    t.add([1, 2, 3, 4])
    n = t.num_nodes
    t.add([5, 6, 1, 2])
    t.remove([5, 6, 1, 2])
    assert t.num_nodes == n and set(t.children()) == {1, 2, 3, 4}
    p = SuffixProposer(depth=8, max_nodes=300)
    for i in range(100):
        p.on_finished(f"r{i}", [0] + list(range(i * 20, i * 20 + 20)), 1)
    assert p.global_tree.num_nodes <= 300
    assert p.propose("x", [99 * 20, 99 * 20 + 1], 2, 2).tokens == [99 * 20 + 2, 99 * 20 + 3]
    assert p.propose("y", [0, 1], 2, 2).tokens == []  # the oldest outputs were forgotten


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="speculation off has no proposer"):
        make_proposer("off")
    with pytest.raises(ValueError, match="supported: off, ngram, suffix, auto"):
        make_proposer("eagle")


def test_policy_drafts_more_when_accepting_and_none_under_load():
    policy = SpecPolicy(k_max=6)
    good, bad = SpecState(alpha=0.9, num_drafted=1), SpecState(alpha=0.005, num_drafted=1)
    for n in (1, 2, 4, 8):  # a CPU-like cost: 10 ms + 0.1 ms per token
        policy.cost.observe(n, 0.010 + 0.0001 * n)
    k_good, k_bad = policy.draft_lens([good, bad], num_tokens=1, num_rows=1)
    assert k_good == 6 and k_bad == 0
    assert policy.draft_lens([SpecState()] * 64, 512, 512) == [0] * 64  # b·R/T = 0.84
    for _ in range(40):
        good.record(4, 0)  # every draft rejected at once
    assert policy.draft_lens([good], 1, 1) == [0]
