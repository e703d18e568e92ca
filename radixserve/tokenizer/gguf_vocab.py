"""A ``tokenizers.Tokenizer`` from a GGUF file's tokenizer metadata (no post-processor).

``tokenizer.ggml.model`` names the vocabulary kind:

* ``gpt2``: byte-level BPE with the file's merges, split by the regexes its
  ``tokenizer.ggml.pre`` names (``gguf_pre_tokenizers``).
* ``llama``: SentencePiece (Llama 2, Mistral, Gemma 1-3, Phi-3 ...): pieces spelled with
  ``▁`` for a space, ``<0xNN>`` pieces for byte fallback. Run as BPE whose merges are rebuilt
  from the vocabulary (``spm_merges``), as transformers does; a SentencePiece Unigram
  vocabulary is read the same way (llama.cpp too merges such a vocabulary greedily by score).
* ``gemma4``: Gemma 4's SentencePiece-style BPE with merges in the file.

How spaces become ``▁`` depends on the architecture, as in transformers' GGUF converters:
Llama style (``Metaspace``: ``▁`` in front of the text's first piece when
``tokenizer.ggml.add_space_prefix``, stripped again by the decoder), Gemma style (a plain
space → ``▁`` normalizer, no prefix) and Phi-3 style (a normalizer that puts ``▁`` in front
of every piece between added tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from radixserve.tokenizer.gguf_pre_tokenizers import IGNORE_MERGES, gguf_pre_tokenizer

__all__ = ["SUPPORTED_MODELS", "gguf_backend", "spm_merges"]

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"
SUPPORTED_MODELS = ("gemma4", "gpt2", "llama")
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})


def spm_merges(tokens: Sequence[str], rank: Mapping[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary: every way to cut a token into two tokens, best
    ``rank`` (a score: higher merges first) first.

    NOTE: the order is transformers' ``generate_merges``, which its GGUF tokenizers use, so
    ties break the same way: by the longer left piece, then the longer right piece, then by
    the token's place in the vocabulary and the pieces' ids.
    """
    ids = {token: i for i, token in enumerate(tokens)}
    merges: list[tuple[float, int, int, int, str, str]] = []
    order = 0
    for token, score in rank.items():
        cuts = sorted((ids[token[:k]], ids[token[k:]], k) for k in range(1, len(token))
                      if token[:k] in ids and token[k:] in ids)
        for _, _, k in cuts:
            merges.append((-score, -k, -(len(token) - k), order, token[:k], token[k:]))
            order += 1
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def _spm_space_rules(backend: HFTokenizer, style: str, add_prefix: bool) -> None:
    """How a space becomes ``▁`` (see the module docstring), and back when decoding."""
    back = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if style == "gemma":
        backend.normalizer = normalizers.Replace(" ", _SPACE)
        if add_prefix:
            backend.normalizer = normalizers.Sequence(
                [normalizers.Prepend(_SPACE), normalizers.Replace(" ", _SPACE)])
    elif style == "phi3":
        backend.normalizer = normalizers.Sequence(
            [normalizers.Prepend(_SPACE), normalizers.Replace(" ", _SPACE)])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=_SPACE, prepend_scheme="first" if add_prefix else "never", split=False)
    if add_prefix or style == "phi3":
        back.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(back)


def _spm_backend(meta: Mapping[str, Any], architecture: str) -> HFTokenizer:
    """SentencePiece vocabularies (``llama``, ``gemma4``) as byte-fallback BPE."""
    tokens: list[str] = list(meta["ggml.tokens"])
    style = ("gemma" if architecture in _GEMMA_ARCHS or meta["ggml.model"] == "gemma4"
             else "phi3" if architecture == "phi3" else "llama")
    if style == "gemma":
        # Gemma stores a piece of only spaces as real spaces; its text has ▁ there.
        tokens = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    if "ggml.merges" in meta:
        merges = [tuple(m.split(" ", 1)) for m in meta["ggml.merges"]]
    elif style == "gemma":  # Gemma's scores are not its merge order; its token order is
        merges = spm_merges(tokens, {t: -i for i, t in enumerate(tokens)})
    else:
        merges = spm_merges(tokens, dict(zip(tokens, meta["ggml.scores"])))
    unk_id = meta.get("ggml.unknown_token_id")
    backend = HFTokenizer(models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=True,
        byte_fallback=True, unk_token=tokens[unk_id] if unk_id is not None else None))
    # Older files lack the flag; llama.cpp then puts the space in front.
    add_prefix = meta.get("ggml.add_space_prefix", style == "llama")
    _spm_space_rules(backend, style, add_prefix)
    return backend


def _bpe_backend(meta: Mapping[str, Any]) -> HFTokenizer:
    """Byte-level BPE (``gpt2``)."""
    pre_type = meta.get("ggml.pre", "default")
    pre_tokenizer = gguf_pre_tokenizer(pre_type)
    tokens: list[str] = meta["ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in meta["ggml.merges"]]
    backend = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     ignore_merges=pre_type in IGNORE_MERGES))
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    return backend


def _add_marked_tokens(backend: HFTokenizer, tokens: Sequence[str],
                       token_types: Sequence[int]) -> None:
    """Control tokens as special added tokens, user-defined ones as plain added tokens: both
    are matched whole in text, never cut (a user-defined token whose spelling the vocabulary
    changed, like Gemma's space runs, stays an ordinary piece)."""
    vocab = backend.get_vocab()
    backend.add_tokens(
        [AddedToken(tokens[i], special=True, normalized=False)
         for i, kind in enumerate(token_types) if kind == _CONTROL]
        + [AddedToken(tokens[i], special=False, normalized=False)
           for i, kind in enumerate(token_types) if kind == _USER_DEFINED and tokens[i] in vocab]
    )


def gguf_backend(meta: Mapping[str, Any], architecture: str = "") -> HFTokenizer:
    """The backend for GGUF tokenizer metadata (``tokenizer.*`` keys without the prefix) of a
    model of ``architecture`` (``general.architecture``). ValueError for a tokenizer model or
    pre-tokenizer it does not support, naming the supported ones."""
    model_type = meta.get("ggml.model")
    if model_type == "gpt2":
        backend = _bpe_backend(meta)
    elif model_type in ("llama", "gemma4"):
        backend = _spm_backend(meta, architecture)
    else:
        raise ValueError(
            f"unsupported GGUF tokenizer model {model_type!r}; supported: {list(SUPPORTED_MODELS)}")
    _add_marked_tokens(backend, meta["ggml.tokens"], meta.get("ggml.token_type") or ())
    return backend
