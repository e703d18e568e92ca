"""llguidance's view built from the tokenizer's byte table (structured/llguidance_tokenizer.py)
equals the one llguidance builds from the ``tokenizers`` JSON: every id's bytes and special
mark, the eos ids, the padded ids past the vocabulary, the tokenization it asks for, and the
masks a grammar gives along a walk."""

from __future__ import annotations

import json

import llguidance
import numpy as np
import pytest

from radixserve.models.source import ModelSource
from radixserve.structured import llguidance_tokenizer
from radixserve.structured.llguidance_tokenizer import _Vocabulary, ll_tokenizer
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer
from gguf_vocabs import (
    CORPUS,
    RARE,
    train_byte_level_bpe,
    train_sentencepiece,
    write_bpe_gguf,
    write_spm_gguf,
)
from tokenizers import pre_tokenizers

PAD = 13  # logits wider than the vocabulary, as a model's padded rows make them


@pytest.fixture(scope="module", params=["embedded", "spm-llama", "spm-gemma3", "bpe-qwen2"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    if request.param == "embedded":
        return load_tokenizer(ModelSource.resolve(None))
    folder = tmp_path_factory.mktemp(request.param)
    if request.param.startswith("spm"):
        arch = request.param.split("-")[1]
        sp = train_sentencepiece("bpe", add_dummy_prefix=arch == "llama",
                                 gemma_names=arch == "gemma3")
        return Tokenizer.from_gguf(write_spm_gguf(folder / "t.gguf", sp, arch=arch,
                                                  add_space_prefix=arch == "llama",
                                                  spaces_as_spaces=arch == "gemma3"))
    bpe = train_byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))
    return Tokenizer.from_gguf(write_bpe_gguf(folder / "t.gguf", bpe, "qwen2"))


def _views(tokenizer: Tokenizer):
    n = tokenizer.vocab_size + PAD
    eos = sorted(tokenizer.eos_token_ids) or None
    from_json = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=n, eos_token=eos)
    return from_json, ll_tokenizer(tokenizer, n), n


# the vocabularies the byte-table view serves (SentencePiece's llama one prepends a space)
TABLE_VIEW = {"embedded": True, "spm-llama": False, "spm-gemma3": True, "bpe-qwen2": True}


def test_the_table_view_is_built_where_the_text_is_spelled_as_is(request, tokenizer,
                                                                 monkeypatch):
    built = []
    monkeypatch.setattr(llguidance_tokenizer, "_Vocabulary",
                        lambda *a: built.append(a) or _Vocabulary(*a))
    ll_tokenizer(tokenizer, tokenizer.vocab_size)
    assert bool(built) == TABLE_VIEW[request.node.callspec.params["tokenizer"]]


def test_every_id_reads_the_same(tokenizer):
    from_json, from_table, n = _views(tokenizer)
    ids = list(range(n))
    assert from_table.vocab_size == from_json.vocab_size == n
    assert [from_table.decode_bytes([i]) for i in ids] == [from_json.decode_bytes([i])
                                                           for i in ids]
    assert ([from_table.is_special_token(i) for i in ids]
            == [from_json.is_special_token(i) for i in ids])
    assert from_table.eos_tokens == from_json.eos_tokens
    assert any(from_table.is_special_token(i) for i in range(tokenizer.vocab_size))


@pytest.mark.parametrize("text", [*CORPUS, *RARE, "a<think>b</think>", "\xe9t\xe9 \U0001f600"])
def test_text_tokenizes_the_same(tokenizer, text):
    from_json, from_table, _ = _views(tokenizer)
    assert from_table.tokenize_str(text) == from_json.tokenize_str(text)
    raw = text.encode("utf-8")[:-1]  # a broken last character: llguidance's greedy tail
    assert from_table.tokenize_bytes(raw) == from_json.tokenize_bytes(raw)


def _walk(view, grammar: str, steps: int) -> list[bytes]:
    """The masks along a walk that takes the highest allowed id each step."""
    matcher = llguidance.LLMatcher(view, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    masks = []
    for _ in range(steps):
        if matcher.is_stopped():
            break
        mask = matcher.compute_bitmask()
        masks.append(mask)
        bits = np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")
        assert matcher.consume_token(int(np.flatnonzero(bits)[-1]))
    return masks


@pytest.mark.parametrize("grammar", [
    llguidance.LLMatcher.grammar_from_json_schema(json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
         "required": ["name", "n"]})),
    llguidance.LLMatcher.grammar_from_regex(r"(yes|no|maybe)[0-9]{2,4} ok"),
])
def test_grammar_masks_are_the_same(tokenizer, grammar):
    from_json, from_table, _ = _views(tokenizer)
    assert _walk(from_table, grammar, 12) == _walk(from_json, grammar, 12)


def test_special_ids_follow_llguidances_reading_of_the_json(tokenizer):
    """Every added token flagged special, or spelled <...>, carries the special mark."""
    vocabulary = _Vocabulary(tokenizer, tokenizer.token_bytes_table.pieces,
                             tokenizer.vocab_size)
    added = json.loads(tokenizer.backend.to_str())["added_tokens"]
    expected = sorted(a["id"] for a in added if a["special"]
                      or (a["content"].startswith("<") and a["content"].endswith(">")))
    assert vocabulary.special_token_ids == expected
    assert all(vocabulary.tokens[i].startswith(b"\xff") for i in expected)


def test_a_tokenizer_larger_than_the_logits_keeps_the_json_error():
    tokenizer = load_tokenizer(ModelSource.resolve(None))
    with pytest.raises(ValueError, match="vocab size too small"):
        ll_tokenizer(tokenizer, tokenizer.vocab_size - 1)
