"""The end-of-generation (EOG) ids of a vocabulary: every token after which a model has said
all it will say, as llama.cpp's ``special_eog_ids`` (llama-vocab.cpp) collects them.

A model's metadata names one eos (and a GGUF file maybe an eot / eom, a Hugging Face folder a
``generation_config.json`` list), but models end their text with others too: Qwen2.5-Coder's
chat turns end with ``<|im_end|>`` (its eos), a document or FIM answer with ``<|endoftext|>``.
So the set is the named ids, the FIM pad / repository / file separator tokens, and every
token spelled as one of `EOG_TEXTS`. Unlike llama.cpp's list, that one lacks ``</s>``: where it
ends generation it is the named eos, and elsewhere it is text (Qwen's vocabulary has it as an
ordinary piece, HTML's strike-through tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["EOG_TEXTS", "eog_token_ids"]

EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "▁<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})


def eog_token_ids(vocab: Mapping[str, int], named: Iterable[int | None],
                  fim_end_ids: Iterable[int] = ()) -> set[int]:
    """The EOG ids of a vocabulary (``vocab``: token text → id, the tokens to match by
    spelling): the ``named`` ids (eos, eot, eom; None skipped), ``fim_end_ids`` and the
    tokens spelled as one of `EOG_TEXTS`, less the two llama.cpp leaves out: ``<|end|>``
    where ``<|return|>`` and ``<|call|>`` (gpt-oss) or ``<|calls|>`` and ``<|flush|>``
    (Solar Open) end turns, and ``</s>`` where ``<|tool_response>`` is one (Gemma 4)."""
    spelled = {text: vocab[text] for text in EOG_TEXTS | {"</s>"} if text in vocab}
    named = {i for i in named if i is not None}
    ids = {i for t, i in spelled.items() if t != "</s>"} | named | set(fim_end_ids)
    if "<|end|>" in spelled and ({"<|return|>", "<|call|>"} <= spelled.keys()
                                 or {"<|calls|>", "<|flush|>"} <= spelled.keys()):
        ids.discard(spelled["<|end|>"])
    if "</s>" in spelled and "<|tool_response>" in spelled:  # even as the named eos
        ids.discard(spelled["</s>"])
    return ids
