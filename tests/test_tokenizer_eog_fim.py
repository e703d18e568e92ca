"""End-of-generation ids and fill-in-the-middle tokens, as llama.cpp finds them: on a Qwen-like
GGUF and Hugging Face folder with Qwen2.5-Coder's FIM tokens (tiny_fim), on a CodeLlama-like
SentencePiece GGUF (gguf_vocabs), and on plain vocabularies; the FIM prompts' exact ids."""

from __future__ import annotations

import pytest
from gguf_vocabs import train_sentencepiece, write_spm_gguf
from tiny_fim import (
    ENDOFTEXT,
    FILE_SEP,
    IM_END,
    MIDDLE,
    PAD,
    PREFIX,
    REPO,
    SUFFIX,
    make_fim_gguf,
    make_fim_hf_model,
)

from radixserve.tokenizer.eog import eog_token_ids
from radixserve.tokenizer.fim import FimTokens, find_fim_tokens, no_fim_reason
from radixserve.tokenizer.fim_prompt import InfillBudget, fim_prompt_ids
from radixserve.tokenizer.tokenizer import Tokenizer

QWEN_EOG = {ENDOFTEXT, IM_END, PAD, REPO, FILE_SEP}


@pytest.fixture(scope="module")
def fim_tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("fim")
    hf = make_fim_hf_model(root / "hf")
    gguf = make_fim_gguf(hf, root / "gguf" / "fim.gguf")
    return {"hf": Tokenizer.from_hf_dir(hf), "gguf": Tokenizer.from_gguf(gguf)}


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_qwen_like_vocab_ends_at_endoftext_and_fim_controls(fim_tokenizers, kind):
    tok = fim_tokenizers[kind]
    # eos (<|im_end|>) named; <|endoftext|> by spelling; the FIM pad / repo / file sep
    assert tok.eos_token_ids == QWEN_EOG
    assert tok.fim == FimTokens(PREFIX, SUFFIX, MIDDLE, PAD, REPO, FILE_SEP)
    assert tok.bos_prefix == []


def test_codellama_like_spm_gguf(tmp_path):
    control = ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>", "<end_of_turn>")
    sp = train_sentencepiece("bpe", control=control)
    tok = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "spm.gguf", sp))
    pre, suf, mid, eot, turn = (sp.piece_to_id(p) for p in control)
    assert tok.eos_token_ids == {sp.eos_id(), eot, turn}
    assert tok.fim == FimTokens(pre, suf, mid)
    assert tok.bos_prefix == [sp.bos_id()]
    ids = fim_prompt_ids(tok, "def f(x):\n    ", "\n    return y\n")
    assert ids == [sp.bos_id(), pre, *tok.encode_text("def f(x):\n    "), suf,
                   *tok.encode_text("\n    return y\n"), mid]


def test_plain_vocab_has_no_fim(tmp_path):
    sp = train_sentencepiece("bpe")
    tok = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "plain.gguf", sp))
    assert tok.fim is None and tok.eos_token_ids == {sp.eos_id()}
    with pytest.raises(ValueError, match="no fill-in-the-middle prefix/suffix/middle token"):
        fim_prompt_ids(tok, "a", "b")


def test_eog_by_spelling_and_llama_cpp_exceptions():
    vocab = {"<|endoftext|>": 0, "<|im_end|>": 1, "<end_of_turn>": 2, "</s>": 3, "x": 4}
    assert eog_token_ids(vocab, [None]) == {0, 1, 2}  # </s> is text unless named
    assert eog_token_ids(vocab, [3, None], [9]) == {0, 1, 2, 3, 9}
    harmony = {"<|end|>": 0, "<|return|>": 1, "<|call|>": 2}
    assert eog_token_ids(harmony, [1]) == {1, 2}
    assert eog_token_ids({"<|end|>": 0}, []) == {0}
    gemma4 = {"</s>": 0, "<|tool_response>": 1, "<turn|>": 2}
    assert eog_token_ids(gemma4, [0]) == {1, 2}


@pytest.mark.parametrize("spellings, suffix_first", [
    (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), False),
    (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), False),
    (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), False),
    (("▁<PRE>", "▁<SUF>", "▁<MID>"), False),
    (("<PRE>", "<SUF>", "<MID>"), False),
    (("[PREFIX]", "[SUFFIX]", "[MIDDLE]"), True),
])
def test_fim_spellings(spellings, suffix_first):
    vocab = {text: 10 + i for i, text in enumerate(spellings)} | {"a": 0}
    fim = find_fim_tokens(vocab)
    assert (fim.prefix, fim.suffix) == (10, 11)
    assert fim.middle == (None if suffix_first else 12)  # Codestral writes after the prefix
    assert fim.is_suffix_first == suffix_first


def test_fim_metadata_wins_and_missing_roles_are_named():
    vocab = {"a": 0, "<|fim_prefix|>": 1, "<|fim_suffix|>": 2, "<|fim_middle|>": 3, "p": 4,
             "s": 5}
    meta = {"ggml.fim_pre_token_id": 4, "ggml.suffix_token_id": 5, "ggml.fim_mid_token_id": 99}
    assert find_fim_tokens(vocab, meta) == FimTokens(4, 5, 3)  # 99: outside the vocabulary
    half = {"<fim_prefix>": 1, "<fim_suffix>": 2}
    assert find_fim_tokens(half) is None
    assert "fill-in-the-middle middle token" in no_fim_reason(half)


def test_plain_fim_prompt_ids_and_code_stays_text(fim_tokenizers):
    tok = fim_tokenizers["gguf"]
    prefix, suffix = "def add(a, b):\n    return ", "\n<|endoftext|>\n"
    ids = fim_prompt_ids(tok, prefix, suffix)
    assert ids == [PREFIX, *tok.encode_text(prefix), SUFFIX, *tok.encode_text(suffix), MIDDLE]
    assert ENDOFTEXT not in ids  # the spelling in the code is text, not the token
    assert tok.decode(ids, skip_special_tokens=False) == (
        f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>")


def test_repository_layout_and_budget(fim_tokenizers):
    tok = fim_tokenizers["hf"]
    text = tok.encode_text
    ids = fim_prompt_ids(tok, "x = ", "\n", prompt_ids=[7], extra=[("a.py", "A = 1\n")],
                         budget=InfillBudget(n_ctx=512, n_predict=16))
    assert ids == [REPO, *text("myproject\n"), FILE_SEP, *text("a.py\n"), *text("A = 1\n"),
                   FILE_SEP, *text("filename\n"), PREFIX, *text("x = "), 7, SUFFIX,
                   *text("\n"), MIDDLE]
    # batch = 256 of 512: the last 192 prefix tokens, the first 64 - 2 - 1 suffix tokens,
    # the last 512 - 256 - 32 extra tokens
    budget = InfillBudget(n_ctx=512, n_predict=16)
    long_prefix, long_suffix = "word " * 300, "line\n" * 200
    ids = fim_prompt_ids(tok, long_prefix, long_suffix, prompt_ids=[7],
                         extra=[("big.py", "data " * 400)], budget=budget)
    extra = [REPO, *text("myproject\n"), FILE_SEP, *text("big.py\n"), *text("data " * 400),
             FILE_SEP, *text("filename\n")]
    assert len(extra) > 224 and len(text(long_prefix)) > 192 and len(text(long_suffix)) > 61
    assert ids == [*extra[-224:], PREFIX, *text(long_prefix)[-192:], 7, SUFFIX,
                   *text(long_suffix)[:61], MIDDLE]


def test_suffix_first_layout_without_middle():
    class Fake:
        fim = FimTokens(prefix=1, suffix=2, middle=None, is_suffix_first=True)
        @property
        def bos_prefix(self):
            return [0]

        def require_fim(self):
            return self.fim

        def encode_text(self, text):
            return [ord(c) for c in text]

    assert fim_prompt_ids(Fake(), "ab", "c") == [0, 2, ord("c"), 1, ord("a"), ord("b")]
