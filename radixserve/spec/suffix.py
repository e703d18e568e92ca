"""``suffix``: suffix decoding (as Arctic Inference does it) over depth-bounded suffix trees.

Two trees: one per running request over its prompt and output, and a global one over the
outputs of finished requests (agents and edits repeat what earlier answers wrote). A tree holds
every suffix of its sequences cut to ``depth`` tokens, each node counting the occurrences that
pass through it. To draft, the longest tail of the request's context found in a tree (up to
``max_match`` tokens) is followed by its most frequent continuation while that continuation
keeps at least ``min_prob`` of its parent's count.

Memory is bounded: the global tree holds at most ``max_nodes`` nodes, forgetting the oldest
outputs first (their counts are subtracted and empty nodes removed); a request's own tree is
dropped when it finishes.
"""

from __future__ import annotations

from collections import deque


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTree:
    """Suffixes of appended sequences, cut to ``depth`` tokens. ``extend`` one sequence token
    by token (a request's context) or ``add``/``remove`` whole ones (the global outputs)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self.num_nodes = 1
        self._active: list[_Node] = []  # nodes of the open sequence's suffixes (extend)

    def extend(self, token_ids: list[int]) -> None:
        """Append tokens to the open sequence: each new token extends its last ``depth - 1``
        suffixes and starts one more."""
        for t in token_ids:
            active = []
            for node in [*self._active, self.root]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                    self.num_nodes += 1
                child.count += 1
                active.append(child)
            self._active = active[-(self.depth - 1):] if self.depth > 1 else []

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
        that is a path from the root; (0, None) if not even its last token is."""
        for m in range(min(max_match, len(context), self.depth - 1), 0, -1):
            node = self.root
            for t in context[len(context) - m:]:
                node = node.children.get(t)
                if node is None:
                    break
            else:
                if node.children:
                    return m, node
        return 0, None


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
                 max_nodes: int = 200_000, max_tokens: int | None = None) -> None:
        """``max_tokens`` (the CLI's bound) caps the global tree at that many nodes when set."""
        self.depth, self.max_match, self.min_prob = depth, max_match, min_prob
        self.max_nodes = max_tokens or max_nodes
        self._trees: dict[str, tuple[SuffixTree, list[int]]] = {}  # request -> (tree, [fed])
        self.global_tree = SuffixTree(depth)
        self._outputs: deque[list[int]] = deque()

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> list[int]:
        if k <= 0:
            return []
        entry = self._trees.get(request_id)
        if entry is None:
            entry = self._trees[request_id] = (SuffixTree(self.depth), [0])
        tree, fed = entry
        tree.extend(token_ids[fed[0]:])
        fed[0] = len(token_ids)
        m_own, own = tree.match(token_ids, self.max_match)
        m_glob, glob = self.global_tree.match(token_ids, self.max_match)
        best = own if (own is not None and m_own >= m_glob) else glob
        if best is None:
            return []
        return _follow(best, k, self.min_prob)

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self._trees.pop(request_id, None)
        output = token_ids[num_prompt:]
        if len(output) < 2:
            return
        self.global_tree.add(output)
        self._outputs.append(output)
        while self.global_tree.num_nodes > self.max_nodes and len(self._outputs) > 1:
            self.global_tree.remove(self._outputs.popleft())
