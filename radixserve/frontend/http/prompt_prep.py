"""Chat templating and prompt tokenization off the event loop, after a length check.

Both grow with the input (a 30 MB prompt: a second of templating, tens of seconds and gigabytes
of tokenizing), so they run on one worker thread (``tokenizers`` releases the GIL while it
encodes; one thread also keeps the tokenizer's piece cache single-threaded). Before either, a
prompt whose length alone proves it longer than the context window is refused: ``c``
characters are at least ``c / k`` tokens (`length_bound`), which costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from radixserve.tokenizer.length_bound import max_chars_per_token
from radixserve.tokenizer.tokenizer import Tokenizer
from radixserve.frontend.http.protocol_base import OpenAIError

logger = logging.getLogger(__name__)


class PromptPrep:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.chars_per_token = max_chars_per_token(tokenizer.backend, tokenizer.token_bytes_table)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-prompt")
        if self.chars_per_token is None:
            logger.warning("prompt length bound: none for this tokenizer's pipeline (it may "
                           "shrink text); long prompts are tokenized in full (off the loop)")
        else:
            logger.info("prompt length bound: a token covers at most %d characters",
                        self.chars_per_token)

    def min_tokens(self, num_chars: int) -> int:
        """The fewest tokens a text of ``num_chars`` characters can have."""
        k = self.chars_per_token
        return 0 if k is None else -(-num_chars // k)

    def check_length(self, num_chars: int, param: str) -> None:
        """400 context_length_exceeded if a text this long cannot fit the context window."""
        at_least = self.min_tokens(num_chars)
        if at_least > self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has at least {at_least} tokens ({num_chars} characters). Please "
                f"reduce the length of the prompt.", param=param,
                code="context_length_exceeded")

    def check_messages(self, messages: Sequence) -> None:
        """The length check on a chat's messages before rendering them (rendering a 30 MB
        message holds the GIL for a tenth of a second): the last message, and every one not
        from the assistant (templates may drop earlier turns' reasoning, never these), all
        appear whole in the prompt."""
        kept = [m for m in messages[:-1] if m.role != "assistant"] + list(messages[-1:])
        self.check_length(sum(_text_len(m) for m in kept), "messages")

    async def run(self, fn: Callable, *args):
        """``fn(*args)`` on the worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def chat_prompt(self, render: Callable[[], str], param: str = "messages"
                          ) -> tuple[str, list[int]]:
        """(the rendered prompt, its ids): ``render()`` then the length check and the encode,
        all on the worker thread."""
        def work() -> tuple[str, list[int]]:
            text = render()
            self.check_length(len(text), param)
            return text, self.tokenizer.encode_prompt(text)

        return await self.run(work)

    async def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``tokenizer.encode_batch(texts)`` on the worker thread."""
        return await self.run(self.tokenizer.encode_batch, list(texts), True)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _text_len(message) -> int:
    if isinstance(message.content, str):
        return len(message.content)
    return sum(len(part.text) for part in message.content or () if part.type == "text")
