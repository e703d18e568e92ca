"""Speculative decoding: proposers that draft tokens, and the policy that sizes each draft."""
