"""BatchEncoder: prompt tokenization off the API process's event loop.

``tokenizers``' single ``encode`` holds the GIL (a 512-token prompt is ~1 ms here, the largest
per-request cost of the frontend), while ``encode_batch`` releases it and runs in parallel in
Rust. So prompts that arrive while the loop is busy are gathered and tokenized together by one
``encode_batch`` on a worker thread; the loop serves streams meanwhile. Short texts are encoded
inline: the thread hop would cost more than the encode. Ids are the same as ``encode``'s.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from radixserve.tokenizer.tokenizer import Tokenizer

INLINE_MAX_CHARS = 256  # texts up to this long are encoded on the loop
MAX_BATCH = 64


class BatchEncoder:
    def __init__(self, tokenizer: Tokenizer, inline_max_chars: int = INLINE_MAX_CHARS) -> None:
        self.tokenizer = tokenizer
        self.inline_max_chars = inline_max_chars
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-encode")
        self._pending: list[tuple[str, bool, asyncio.Future]] = []
        self._draining = False

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens)``, awaited."""
        if len(text) <= self.inline_max_chars:
            return self.tokenizer.encode(text, add_special_tokens)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((text, add_special_tokens, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Encode what is pending, batch by batch, until nothing is (a batch holds the texts
        that arrived while the previous one ran)."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0)  # let the requests of this loop iteration join
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                for special in (True, False):
                    part = [item for item in batch if item[1] is special]
                    if part:
                        await self._run(loop, part, special)
        finally:
            self._draining = False

    async def _run(self, loop, part, special: bool) -> None:
        texts = [text for text, _, _ in part]
        try:
            ids = await loop.run_in_executor(self._pool, self.tokenizer.encode_batch, texts,
                                             special)
        except Exception as e:  # noqa: BLE001 — handed to every waiting caller
            for _, _, future in part:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), one in zip(part, ids):
            if not future.done():  # its request may have been cancelled meanwhile
                future.set_result(one)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
