"""BatchEncoder: the ids of ``encode``, whether a text is encoded inline or batched on the
worker thread, alone or together with others; errors and cancellations reach only their
callers."""

from __future__ import annotations

import asyncio
import random

import pytest

from radixserve.frontend.batch_encoder import BatchEncoder
from radixserve.tokenizer.tokenizer import Tokenizer
from radixserve.models.default import default_model_path


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(default_model_path())


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["hello", "world", "café", "naïve", "日本語", " ", "\n", "<|im_start|>", "1234", "🙂"]
    return ["".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(rng.randrange(1, 400)))
            for _ in range(n)]


def test_same_ids_as_encode_alone_and_concurrently(tokenizer):
    encoder = BatchEncoder(tokenizer)
    batch = texts(40)
    assert any(len(t) <= encoder.inline_max_chars for t in batch)
    assert any(len(t) > encoder.inline_max_chars for t in batch)

    async def main():
        one = [await encoder.encode(t) for t in batch[:3]]
        together = await asyncio.gather(*(encoder.encode(t) for t in batch))
        plain = await asyncio.gather(*(encoder.encode(t, add_special_tokens=False)
                                       for t in batch))
        return one, together, plain

    one, together, plain = asyncio.run(main())
    assert one == [tokenizer.encode(t) for t in batch[:3]]
    assert together == [tokenizer.encode(t) for t in batch]
    assert plain == [tokenizer.encode(t, add_special_tokens=False) for t in batch]
    encoder.close()


def test_errors_and_cancellations_stay_with_their_callers(tokenizer):
    class Failing:
        def __init__(self):
            self.fail = True

        def encode(self, text, add_special_tokens=True):
            return tokenizer.encode(text, add_special_tokens)

        def encode_batch(self, texts, add_special_tokens=True):
            if self.fail:
                self.fail = False
                raise RuntimeError("tokenizer broke")
            return tokenizer.encode_batch(texts, add_special_tokens)

    encoder = BatchEncoder(Failing(), inline_max_chars=0)

    async def main():
        first = await asyncio.gather(encoder.encode("a b c"), encoder.encode("d e"),
                                     return_exceptions=True)
        cancelled = asyncio.ensure_future(encoder.encode("gone"))
        kept = asyncio.ensure_future(encoder.encode("kept text"))
        await asyncio.sleep(0)
        cancelled.cancel()
        return first, await kept

    first, kept = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) for e in first)
    assert kept == tokenizer.encode("kept text")  # the encoder kept working
    encoder.close()
