"""A chat request with images → its prompt text, token ids and `ImageInput`s (API process).

The chat template renders each message that carries images with its content as the parts HF
vision templates iterate (``{"type": "text", "text": ...}`` / ``{"type": "image"}``), where it
writes the model's placeholder once per image; radixserve/multimodal/prompt.py then expands the
placeholders, tokenizes the prompt and finds each image's span of image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from radixserve.frontend.openai.chat_render import render_messages
from radixserve.messages import ImageInput
from radixserve.multimodal.prompt import place_images

__all__ = ["render_chat_images"]


def render_chat_images(ctx, body, images: list[Image.Image]
                       ) -> tuple[str, list[int], list[ImageInput]]:
    """(the expanded prompt text, its token ids, one `ImageInput` per image in prompt order).

    ``body``: a chat request whose user messages may carry ``image_url`` parts; ``images``:
    those parts' decoded images, in order; ``ctx.images``: the served model's `ImageProcessor`
    (None: text only). Pure (reads ``ctx``, mutates nothing); CPU-heavy (resize, hashing):
    call it off the event loop. ValueError (a 400) when images go to a text-only model, when
    ``images`` does not match the image parts, when the rendered template does not hold one
    placeholder per image (a template that drops images, or a placeholder typed in the text)
    or the tokens do not hold one run of image tokens per image; the template's own errors
    are `render_messages`' OpenAIError.
    """
    parts = [part for m in body.messages for part in m.images()]
    processor = ctx.images
    if parts and processor is None:
        raise ValueError("the served model takes text only: it cannot read images")
    if len(parts) != len(images):
        raise ValueError(f"{len(images)} images for {len(parts)} image parts")
    # every message with text, not only those with images: a vision template may iterate a
    # message's content as parts and print nothing of a plain string (SmolVLM's does)
    contents = [_template_parts(m) if m.images() or (m.content and not m.tool_calls) else None
                for m in body.messages]
    text = render_messages(_TemplateView(_PartsTemplate(ctx.tokenizer, contents)), body)
    if processor is None:
        return text, ctx.tokenizer.encode_prompt(text), []
    return place_images(text, images, [part.image_url.detail for part in parts], processor,
                        ctx.tokenizer.encode_prompt)


def _template_parts(message) -> list[dict[str, Any]]:
    """A message's content as the parts a vision chat template iterates (a string: one text
    part)."""
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}]
    return [{"type": "text", "text": part.text} if part.type == "text" else {"type": "image"}
            for part in message.content]


class _PartsTemplate:
    """The served tokenizer as `render_messages` calls it, with each message that carries
    images rendered from its parts. NOTE: `render_messages` stays the one place a chat request
    becomes a template call (tools, kwargs, continue_final_message, errors); only the content
    it takes from ``ChatMessage.text()`` (which leaves images out) is swapped here."""

    def __init__(self, tokenizer, contents: list[list[dict[str, Any]] | None]) -> None:
        self._tokenizer = tokenizer
        self._contents = contents

    def apply_chat_template(self, messages, **kwargs) -> str:
        assert len(messages) == len(self._contents), "render_messages renders every message"
        shown = [m if parts is None else {**m, "content": parts}
                 for m, parts in zip(messages, self._contents)]
        return self._tokenizer.apply_chat_template(shown, **kwargs)


@dataclass(frozen=True, slots=True)
class _TemplateView:
    """The one thing `render_messages` reads of a serving context."""

    tokenizer: _PartsTemplate
