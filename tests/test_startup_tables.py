"""The start-up's tables built with less work (issue 63): a GGUF's string arrays are parsed by
walking their lengths and read only when used; a tokenizer whose backend is cached never
decodes its vocabulary; a byte-level token's bytes come from one ``str.translate``."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from radixserve.gguf_reader import StringArrayField, open_gguf
from radixserve.models.default import default_model_path
from radixserve.tokenizer import byte_pieces
from radixserve.tokenizer.backend_cache import metadata_key
from radixserve.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def path() -> str:
    return str(default_model_path())


def test_string_arrays_are_read_only_when_used(path):
    reader, ref = open_gguf(path), GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert isinstance(tokens, StringArrayField)
    assert "parts" not in tokens.__dict__  # the parse cut no per-string views
    want = ref.fields["tokenizer.ggml.tokens"]
    assert tokens.nbytes == sum(int(p.nbytes) for p in want.parts)
    assert tokens.end == tokens.offset + tokens.nbytes
    assert tokens.contents(0) == want.contents(0)
    assert tokens.contents(-1) == want.contents(-1)
    assert tokens.contents(slice(5, 50, 7)) == want.contents(slice(5, 50, 7))
    assert "parts" not in tokens.__dict__  # nor did contents()
    with pytest.raises(IndexError):
        tokens.contents(len(tokens.data))
    assert len(tokens.parts) == len(want.parts)  # cut on first use
    assert metadata_key(reader, "llama") == metadata_key(ref, "llama")  # the cache's key


def test_a_cached_backend_never_decodes_the_vocabulary(path, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    decoded: list[str] = []
    contents = StringArrayField.contents

    def counting(self, index_or_slice=slice(None)):
        decoded.append(self.name)
        return contents(self, index_or_slice)

    monkeypatch.setattr(StringArrayField, "contents", counting)
    first = Tokenizer.from_gguf(path)  # builds the backend from the vocabulary, caches it
    assert "tokenizer.ggml.tokens" in decoded
    decoded.clear()
    again = Tokenizer.from_gguf(path)
    assert decoded == []
    assert again.encode("Hello, world!") == first.encode("Hello, world!")
    assert again.eos_token_ids == first.eos_token_ids and again.fim == first.fim


@pytest.mark.parametrize("token", ["Ġhello", "ĠĊĉ", "Ã©", "<|im_start|>", "▁word", "日本",
                                   "a b", "x\u00ady", "\u00a0", "]^-\\", ""])
def test_byte_level_pieces_are_the_table_s_bytes(token):
    """Each character of GPT-2's table is its byte, any other character its UTF-8."""
    table = byte_pieces._BYTE_OF_CHAR
    want = b"".join(bytes((table[c],)) if c in table else c.encode() for c in token)
    assert byte_pieces._byte_level_piece(token) == want
