"""A chat request → its prompt text: the chat template applied to its messages (the OpenAI
routes and every route translated into a chat request; frontend/chat_images.py renders a chat
with images through it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.frontend.http.protocol_base import OpenAIError

if TYPE_CHECKING:
    from radixserve.frontend.openai.serving import ServingContext


def render_messages(ctx: ServingContext, body, kept: list[int] | None = None) -> str:
    """The chat template applied to a chat request (or a tokenize request in chat form);
    ``kept``: the indices of the messages to render (None: all of them)."""
    chosen = body.messages if kept is None else [body.messages[i] for i in kept]
    messages = [_message_dict(m) for m in chosen]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    kwargs = dict(body.chat_template_kwargs or {})
    if getattr(body, "reasoning_effort", None) is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    try:
        text = ctx.tokenizer.apply_chat_template(
            messages, tools=tools, **kwargs,
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message)
    except ValueError as exc:
        raise OpenAIError(str(exc), param="messages") from exc
    except Exception as exc:  # a template's raise_exception or a rendering error
        raise OpenAIError(f"the chat template failed: {exc}", param="messages") from exc
    if body.continue_final_message:
        last = messages[-1].get("content") or ""
        cut = text.rfind(last)
        if cut >= 0:
            text = text[: cut + len(last)]
    return text


def _message_dict(m) -> dict:
    d = {"role": m.role, "content": m.text()}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = [tc.model_dump() for tc in m.tool_calls]
    # what gpt-oss's and LFM2.5's templates read; gpt-oss's refuses it beside a call's text
    # (it writes that text as the call's analysis instead)
    if m.reasoning_content is not None and not (m.tool_calls and m.text()):
        d["thinking"] = m.reasoning_content
    if m.reasoning_content is not None:  # Qwen3's, GLM's, ...: kept within a tool loop
        d["reasoning_content"] = m.reasoning_content
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    return d
