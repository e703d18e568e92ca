"""Byte-level BPE pre-tokenizers named by a GGUF file's ``tokenizer.ggml.pre``.

A byte-level vocabulary's merges were learned on the pieces one regex split (or a chain of
them) cuts text into; each name below is one llama.cpp knows (``llama-vocab.cpp``), with the
regexes of the model's own ``tokenizer.json`` (which ``tokenizers`` runs as written; llama.cpp
rewrites some for its own regex engine). A chain of regexes is a chain of ``Split`` steps:
each step cuts every piece the previous one left, keeping matches and the text between them,
as llama.cpp's ``unicode_regex_split`` does.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenizers import Regex, pre_tokenizers

__all__ = ["IGNORE_MERGES", "PRE_TOKENIZERS", "gguf_pre_tokenizer"]

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The cased letters DeepSeek-LLM lists, as code points (NFC would rewrite some as written).
_LATIN_GREEK_CYRILLIC_ETC = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (
    "[\r\n]",
    r"\s?[" + _LATIN_GREEK_CYRILLIC_ETC + "]+",
    r"\s?[!-/:-~" "\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    """GPT-2's regex, applied by the byte-level pre-tokenizer itself."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    """StarCoder/SmolLM: every digit on its own, then GPT-2's regex."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _splits(*patterns: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    """Regex splits in turn (matches kept as pieces), then a regex-free byte-level mapping."""

    def build() -> pre_tokenizers.PreTokenizer:
        steps = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
                 for p in patterns]
        return pre_tokenizers.Sequence(
            [*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    return build


def _aliases(build: Callable[[], pre_tokenizers.PreTokenizer], *names: str):
    return dict.fromkeys(names, build)


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    # llama.cpp's 'default' chain is its own, but files that say 'default' are GPT-2-like and
    # transformers reads them with GPT-2's regex; so do we.
    **_aliases(_gpt2, "default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais"),
    **_aliases(_digits_then_gpt2, "smollm", "starcoder", "refact", "codeshell", "exaone"),
    **_aliases(_splits(_LLAMA3), "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
               "pixtral", "midm-2.0", "lfm2", "dbrx", "smaug-bpe", "chatglm-bpe"),
    **_aliases(_splits(_QWEN2), "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"),
    "qwen35": _splits(_QWEN35),
    "tekken": _splits(_TEKKEN),
    **_aliases(_splits(_GPT4O), "gpt-4o", "llama4"),
    "deepseek-llm": _splits(*_DEEPSEEK_LLM),
    "deepseek-coder": _splits(*_DEEPSEEK_CODER),
    "deepseek-v3": _splits(*_DEEPSEEK_V3),
}
# These look a whole pre-token up in the vocabulary before merging (llama.cpp's ignore_merges).
IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                           "midm-2.0", "lfm2"})


def gguf_pre_tokenizer(pre_type: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for ``tokenizer.ggml.pre``; ValueError naming the supported ones."""
    if pre_type not in PRE_TOKENIZERS:
        raise ValueError(
            f"unsupported GGUF pre-tokenizer {pre_type!r}; supported: {sorted(PRE_TOKENIZERS)}")
    return PRE_TOKENIZERS[pre_type]()
