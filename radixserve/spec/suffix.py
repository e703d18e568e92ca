"""``suffix``: suffix decoding (as Arctic Inference does it): drafts from the request's own
context and from a depth-bounded suffix tree over the outputs of finished requests (agents
and edits repeat what earlier answers wrote).

The global tree holds every suffix of the outputs cut to ``depth`` tokens, each node counting
the occurrences that pass through it. To draft from it, the longest tail of the request's
context found in the tree (up to ``max_match`` tokens) is followed by its most frequent
continuation while that continuation keeps at least ``min_prob`` of its parent's count. The
request's own context is searched by prompt lookup (spec/ngram.py: the latest occurrence of its
last tokens). The match's length and its source are the draft's evidence (spec/policy.py),
and the source whose evidence has been accepted more often drafts (by the policy's measured
table; the longer match without one). Measured on code edits: the other outputs' longer
matches of similar code, when they won by length alone, drafted 2.09x against prompt
lookup's 2.67x. NOTE: Arctic keeps a suffix tree per request as well; here the
own context goes by its latest occurrence instead, measured on the embedded model: 2.5 µs a
step against 50 µs for growing a per-request tree by ``depth`` nodes a token, and 91% of the
drafted tokens accepted against 81% on the same 16 greedy streams (the latest turn of a loop
or a quote predicts its next token better than the most frequent one).

Matching the global tree costs O(max_match · log max_match): the tails of the context that
are paths form a prefix of the lengths (every suffix of a path is a path, since the tree holds
every suffix), so the longest is found by bisection.

Memory is bounded: the global tree holds at most ``max_nodes`` nodes, forgetting the oldest
outputs first (their counts are subtracted and empty nodes removed); a request's own index is
dropped when it finishes.
"""

from __future__ import annotations

from collections import deque

from radixserve.spec.ngram import NgramProposer
from radixserve.spec.proposer import OTHER_OUTPUTS, Draft


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTree:
    """Suffixes of added sequences, cut to ``depth`` tokens; ``add`` and ``remove`` whole
    sequences."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self.num_nodes = 1

    def add(self, token_ids: list[int]) -> None:
        self._walk_all(token_ids, +1)

    def remove(self, token_ids: list[int]) -> None:
        """Undo an ``add`` of the same tokens."""
        self._walk_all(token_ids, -1)

    def _walk_all(self, token_ids: list[int], delta: int) -> None:
        for i in range(len(token_ids)):
            node = self.root
            for t in token_ids[i:i + self.depth]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                    self.num_nodes += 1
                child.count += delta
                if child.count == 0:
                    self.num_nodes -= _size(child)
                    del node.children[t]
                    break
                node = child

    def match(self, context: list[int], max_match: int) -> tuple[int, _Node | None]:
        """(length, node) of the longest tail of ``context`` (at most ``max_match`` tokens)
        that is a path from the root with a token after it; (0, None) if none."""
        low, high = 0, min(max_match, len(context), self.depth - 1)
        found = None
        while low < high:  # the longest tail that is a path: every shorter one is too
            mid = (low + high + 1) // 2
            node = self._walk(context[len(context) - mid:])
            if node is None:
                high = mid - 1
            else:
                low, found = mid, node
        while low > 0:
            if found is not None and found.children:
                return low, found
            low -= 1  # the path ends an added sequence: a shorter tail may go on
            found = self._walk(context[len(context) - low:]) if low else None
        return 0, None

    def _walk(self, tokens: list[int]) -> _Node | None:
        node = self.root
        for t in tokens:
            node = node.children.get(t)
            if node is None:
                return None
        return node


def _size(node: _Node) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        stack.extend(x.children.values())
    return n


def _follow(node: _Node, k: int, min_prob: float) -> list[int]:
    """The most frequent path below ``node``, at most ``k`` tokens, while each step keeps
    ``min_prob`` of the count before it."""
    draft: list[int] = []
    while len(draft) < k and node.children:
        token, child = max(node.children.items(), key=lambda kv: kv[1].count)
        if child.count < min_prob * node.count:
            break
        draft.append(token)
        node = child
    return draft


class SuffixProposer:
    name = "suffix"
    enabled = True

    def __init__(self, depth: int = 24, max_match: int = 12, min_prob: float = 0.1,
                 max_nodes: int = 200_000, max_tokens: int | None = None,
                 acceptance=None) -> None:
        """``max_tokens`` (the CLI's bound) caps the global tree at that many nodes when set.
        ``acceptance``: the policy's AcceptanceTable (None: the longer match drafts)."""
        self.depth, self.max_match, self.min_prob = depth, max_match, min_prob
        self.acceptance = acceptance
        self.max_nodes = max_tokens or max_nodes
        self.own = NgramProposer()  # each running request's prompt and output
        self.global_tree = SuffixTree(depth)
        self._outputs: deque[list[int]] = deque()

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        own = self.own.propose(request_id, token_ids, num_prompt, k)
        if k > 0 and self.global_tree.root.children:
            m_glob, glob = self.global_tree.match(token_ids, self.max_match)
            if glob is not None and self._better(m_glob, own.match if own.tokens else 0):
                return Draft(_follow(glob, k, self.min_prob), m_glob, OTHER_OUTPUTS)
        return own

    def _better(self, m_glob: int, m_own: int) -> bool:
        """Whether the other outputs' match of ``m_glob`` tokens predicts better than the
        request's own of ``m_own`` (0: none), by the greedy acceptance measured for each."""
        if not m_own:
            return True
        if self.acceptance is None:
            return m_glob > m_own
        from radixserve.spec.policy import evidence_key

        return (self.acceptance.alpha(evidence_key(m_glob, False, OTHER_OUTPUTS))
                > self.acceptance.alpha(evidence_key(m_own, False)))

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self.own.on_finished(request_id, token_ids, num_prompt)
        output = token_ids[num_prompt:]
        if len(output) < 2:
            return
        self.global_tree.add(output)
        self._outputs.append(output)
        while self.global_tree.num_nodes > self.max_nodes and len(self._outputs) > 1:
            self.global_tree.remove(self._outputs.popleft())
