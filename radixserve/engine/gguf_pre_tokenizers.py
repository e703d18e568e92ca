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
_CJK = "[一-龥ࠀ-一가-퟿]+"
_DEEPSEEK_LLM = (
    "[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
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
