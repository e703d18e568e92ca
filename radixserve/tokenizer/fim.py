"""Fill-in-the-middle (FIM) tokens of a vocabulary, found as llama.cpp finds them.

A GGUF file may name them in its metadata (``tokenizer.ggml.fim_pre_token_id`` ... the keys of
gguf-py's ``Keys.Tokenizer``, and the older ``prefix`` / ``suffix`` / ``middle`` ones); where it
does not, and in a Hugging Face folder, they are looked up by their spelling:

=================  ==================  ===================  ==================
family             prefix              suffix               middle
=================  ==================  ===================  ==================
Qwen2.5-Coder      ``<|fim_prefix|>``  ``<|fim_suffix|>``   ``<|fim_middle|>``
StarCoder(2)       ``<fim_prefix>``    ``<fim_suffix>``     ``<fim_middle>``
DeepSeek-Coder     ``<｜fim▁begin｜>``  ``<｜fim▁hole｜>``     ``<｜fim▁end｜>``
CodeLlama          ``▁<PRE>``          ``▁<SUF>``           ``▁<MID>``
Codestral          ``[PREFIX]``        ``[SUFFIX]``         (none: see below)
=================  ==================  ===================  ==================

plus the pad (``<|fim_pad|>``), repository (``<|repo_name|>``) and file separator
(``<|file_sep|>``) tokens of repository-level FIM. Codestral reads its prompt suffix first
(``[SUFFIX]suffix[PREFIX]prefix``) and writes the middle straight after the prefix, as
mistral-common's ``encode_fim`` builds it: its ``[MIDDLE]`` is not part of the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FimTokens", "find_fim_tokens", "no_fim_reason"]

# GGUF metadata keys (without "tokenizer."), the current one first, then the deprecated one
_META_KEYS = {
    "prefix": ("ggml.fim_pre_token_id", "ggml.prefix_token_id"),
    "suffix": ("ggml.fim_suf_token_id", "ggml.suffix_token_id"),
    "middle": ("ggml.fim_mid_token_id", "ggml.middle_token_id"),
    "pad": ("ggml.fim_pad_token_id",),
    "repo": ("ggml.fim_rep_token_id",),
    "file_sep": ("ggml.fim_sep_token_id",),
}
# spellings by role, in llama.cpp's order of preference (llama-vocab.cpp), plus Codestral's
SPELLINGS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>", "<|prefix|>", "[PREFIX]"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "[SUFFIX]"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
               "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
             "<repo_name>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}
_SUFFIX_FIRST = "[PREFIX]"  # Codestral's prefix token: its prompts put the suffix first


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The FIM token ids of one vocabulary. ``middle`` None: the model writes the middle right
    after the prompt (Codestral); ``is_suffix_first``: the prompt is suffix, then prefix (SPM
    order), else prefix, suffix, middle (PSM). ``repo`` / ``file_sep``: repository-level
    context, where the model knows it."""

    prefix: int
    suffix: int
    middle: int | None
    pad: int | None = None
    repo: int | None = None
    file_sep: int | None = None
    is_suffix_first: bool = False

    @property
    def end_ids(self) -> set[int]:
        """Ids that end a generation (llama.cpp's EOG set holds them): pad, repo, file_sep."""
        return {i for i in (self.pad, self.repo, self.file_sep) if i is not None}


def _role_ids(vocab: Mapping[str, int], meta: Mapping[str, Any]) -> dict[str, int]:
    """Each role's id: from the metadata when it names an id inside the vocabulary, else from
    the first spelling the vocabulary holds."""
    size = len(vocab)
    found: dict[str, int] = {}
    for role, keys in _META_KEYS.items():
        for key in keys:
            value = meta.get(key)
            if isinstance(value, int) and 0 <= value < size:
                found[role] = value
                break
        else:
            spelled = next((vocab[t] for t in SPELLINGS[role] if t in vocab), None)
            if spelled is not None:
                found[role] = spelled
    return found


def find_fim_tokens(vocab: Mapping[str, int], meta: Mapping[str, Any] | None = None
                    ) -> FimTokens | None:
    """The FIM tokens of a vocabulary (``vocab``: token text → id, added tokens included;
    ``meta``: GGUF ``tokenizer.*`` metadata without the prefix), None where it lacks a prefix,
    suffix or (but for Codestral) middle token."""
    ids = _role_ids(vocab, meta or {})
    if "prefix" not in ids or "suffix" not in ids:
        return None
    is_suffix_first = vocab.get(_SUFFIX_FIRST) == ids["prefix"]
    if is_suffix_first:
        ids.pop("middle", None)
    elif "middle" not in ids:
        return None
    return FimTokens(ids["prefix"], ids["suffix"], ids.get("middle"), ids.get("pad"),
                     ids.get("repo"), ids.get("file_sep"), is_suffix_first)


def no_fim_reason(vocab: Mapping[str, int], meta: Mapping[str, Any] | None = None) -> str:
    """Why ``find_fim_tokens`` found none: the roles whose tokens are missing."""
    ids = _role_ids(vocab, meta or {})
    missing = [role for role in ("prefix", "suffix", "middle") if role not in ids]
    looked = ", ".join(SPELLINGS["prefix"][:4] + ("▁<PRE>", "[PREFIX]"))
    return (f"the model's vocabulary has no fill-in-the-middle {'/'.join(missing) or 'prefix'} "
            f"token (looked for tokenizer.ggml.fim_*_token_id and spellings such as {looked}): "
            "it is not a FIM (code infill) model")
