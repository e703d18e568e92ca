"""Test helper: a radix-tree node's tokens from the root (core/kv/radix_node.py)."""

from __future__ import annotations


def path_tokens(node) -> list[int]:
    """The tokens from the root to the end of ``node``'s key."""
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return [t for key in reversed(keys) for t in key]
