"""The GGUF tokenizer's backend is cached by its metadata bytes and the code that builds it."""

from __future__ import annotations

import logging

from real_models import gemma3_270m

from radixserve.gguf_reader import open_gguf
from radixserve.models.default import default_model_path
from radixserve.tokenizer import backend_cache
from radixserve.tokenizer.tokenizer import Tokenizer

TEXTS = ["Hello world, this is  a test of   spaces\n\tand tabs.", "<start_of_turn>user\nhi",
         "naïve café — 日本語 🙂", "def f(x):\n    return x ** 2"]


def test_a_cached_tokenizer_encodes_and_decodes_as_a_built_one(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    for path in (str(default_model_path()), gemma3_270m()):
        built = Tokenizer.from_gguf(path)  # a miss: built, then written
        cached = Tokenizer.from_gguf(path)  # a hit
        for text in TEXTS:
            ids = built.encode(text)
            assert cached.encode(text) == ids
            assert cached.decode(ids) == built.decode(ids)
    assert len(list((tmp_path / "tokenizers").glob("*.json"))) == 2


def test_the_key_follows_the_metadata_and_a_damaged_entry_is_rebuilt(tmp_path, monkeypatch,
                                                                     caplog):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    reader = open_gguf(default_model_path())
    key = backend_cache.metadata_key(reader, "llama")
    assert backend_cache.metadata_key(reader, "llama") == key
    assert backend_cache.metadata_key(reader, "qwen2") != key  # the architecture counts
    ref = Tokenizer.from_gguf(reader)
    entry = tmp_path / "tokenizers" / f"{key}.json"
    entry.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        again = Tokenizer.from_gguf(reader)
    assert "unreadable" in caplog.text
    assert again.encode(TEXTS[0]) == ref.encode(TEXTS[0])
    assert entry.read_text().startswith("{")  # rewritten whole


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(blocker / "below"))  # cannot be a folder
    tok = Tokenizer.from_gguf(str(default_model_path()))
    assert tok.decode(tok.encode(TEXTS[2])) == TEXTS[2]
