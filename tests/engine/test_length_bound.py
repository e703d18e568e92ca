"""The token-count lower bound from a text's length (`length_bound`): it holds on the tokenizers
it answers for (every text of ``c`` characters has at least ``c / k`` tokens, adversarial ones
included: the longest tokens repeated), and it answers None for pipelines that may shrink text
by an unknown amount."""

from __future__ import annotations

import random

import pytest
from tiny_models import _tokenizer_json
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from radixserve.tokenizer.length_bound import max_chars_per_token
from radixserve.tokenizer.tokenizer import load_tokenizer
from radixserve.models.source import ModelSource


@pytest.fixture(scope="module")
def embedded():
    return load_tokenizer(ModelSource.resolve(None)).backend


def _texts(backend: Tokenizer, seed: int = 0) -> list[str]:
    """Ordinary text, the vocabulary's longest tokens glued together, special tokens, CJK."""
    rng = random.Random(seed)
    vocab = sorted(backend.get_vocab(), key=len, reverse=True)[:50]
    decoded = [backend.decode([backend.token_to_id(t)], skip_special_tokens=False)
               for t in vocab]
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    return ["Once upon a time there was a tokenizer. " * 20,
            "".join(decoded) * 5, "".join(rng.choice(decoded) for _ in range(300)),
            "".join(added) * 10, " " * 5000, "\n" * 777, "語" * 1000,
            "".join(chr(rng.randrange(32, 0x3000)) for _ in range(2000))]


def _assert_bound_holds(backend: Tokenizer) -> int:
    k = max_chars_per_token(backend)
    assert k is not None and k >= 1
    for text in _texts(backend):
        num_tokens = len(backend.encode(text, add_special_tokens=False).ids)
        assert num_tokens * k >= len(text), (k, num_tokens, len(text), text[:40])
    return k


def test_bound_holds_for_the_embedded_byte_level_vocabulary(embedded):
    k = _assert_bound_holds(embedded)
    assert k == 81  # its longest token, 81 bytes (a run of spaces / dashes)


def test_bound_holds_for_the_tiny_test_tokenizer():
    _assert_bound_holds(Tokenizer.from_str(_tokenizer_json()))


def test_a_composing_normalizer_widens_the_bound(embedded):
    plain = max_chars_per_token(embedded)
    nfc = Tokenizer.from_str(embedded.to_str())
    nfc.normalizer = normalizers.NFC()
    assert max_chars_per_token(nfc) == 8 * plain
    _assert_bound_holds(nfc)


def _word_level() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def _bpe_with(pre=None, norm=None) -> Tokenizer:
    tok = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    tok.pre_tokenizer, tok.normalizer = pre, norm
    tok.decoder = decoders.BPEDecoder()
    return tok


@pytest.mark.parametrize("make", [
    _word_level,  # one [UNK] for a whole word
    lambda: _bpe_with(pre=pre_tokenizers.Whitespace()),  # drops the spaces
    lambda: _bpe_with(norm=normalizers.StripAccents()),  # drops combining marks
    lambda: _bpe_with(norm=normalizers.Strip()),
    lambda: _bpe_with(norm=normalizers.Replace("a", "")),  # deletes
], ids=["word-level-unk", "whitespace-split", "strip-accents", "strip", "replace-delete"])
def test_no_bound_for_pipelines_that_shrink_text(make):
    assert max_chars_per_token(make()) is None


def test_whitespace_splitting_really_breaks_any_bound():
    tok = _bpe_with(pre=pre_tokenizers.Whitespace())
    assert len(tok.encode(" " * 3000 + "ab").ids) == 1  # 3,002 characters, one token


def test_replacing_with_a_shorter_string_scales_the_bound():
    tok = _bpe_with(norm=normalizers.Replace("aaaa", "b"))
    assert max_chars_per_token(tok) == 2 * 4  # the longest token "ab" x (4 chars -> 1)
