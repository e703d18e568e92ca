// One chat message as DOM: markdown body (safe: markdown.js), reasoning as a collapsible
// block, tool calls as cards, a user turn's images as thumbnails, the per-message numbers, and
// the action buttons.

import { thumbnail } from "./images.js";
import { renderMarkdown } from "./markdown.js";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// A model that writes <think>…</think> without a reasoning parser on the server: split it.
export function splitThink(content) {
  const m = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/.exec(content);
  if (!m) return { reasoning: "", answer: content };
  return { reasoning: m[1], answer: m[3], open: !m[2] };
}

function button(label, action, index) {
  const b = el("button", "msg-action", label);
  b.type = "button";
  b.dataset.action = action;
  b.dataset.index = index;
  return b;
}

export function statsLine(stats) {
  if (!stats) return "";
  const parts = [];
  // while the prompt prefills (the server's prompt_progress), before the first token
  const p = stats.prefill;
  if (p) parts.push(`prefill ${p.processed.toLocaleString()} / ${p.total.toLocaleString()}`);
  if (stats.prompt_tokens !== undefined) parts.push(`${stats.prompt_tokens} prompt`);
  if (stats.completion_tokens !== undefined) {
    parts.push(`${stats.estimated ? "~" : ""}${stats.completion_tokens} tokens`);
  }
  if (stats.ttft_ms !== undefined) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tok_s !== undefined) parts.push(`${stats.tok_s.toFixed(1)} tok/s`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(" · ");
}

// `streaming`: this message is being generated (no actions yet).
export function renderMessage(msg, index, { streaming = false, isLast = false } = {}) {
  const box = el("div", `msg ${msg.role}`);
  box.dataset.index = index;
  box.append(el("div", "msg-role", msg.role));
  let reasoning = msg.reasoning || "";
  let answer = msg.content || "";
  let open = streaming && !answer;
  if (!reasoning) {
    const s = splitThink(answer);
    reasoning = s.reasoning;
    answer = s.answer;
    open = streaming && s.open;
  }
  if (reasoning) {
    const d = el("details", "reasoning");
    d.open = open;
    d.append(el("summary", null, open ? "Reasoning…" : "Reasoning"));
    const body = el("div", "reasoning-body");
    body.append(renderMarkdown(reasoning));
    d.append(body);
    box.append(d);
  }
  if (msg.images && msg.images.length) {
    const thumbs = el("div", "thumbs");
    thumbs.append(...msg.images.map((im) => thumbnail(im)));
    box.append(thumbs);
  }
  const body = el("div", "msg-body");
  if (msg.role === "user") body.textContent = answer;  // what the user typed, as typed
  else body.append(renderMarkdown(answer));
  box.append(body);
  for (const call of msg.tool_calls || []) box.append(toolCard(call));
  if (msg.error) box.append(el("div", "msg-error error", msg.error));
  if (msg.role === "assistant") {
    box.append(el("div", "msg-meta muted", statsLine(msg.stats)));
  }
  if (!streaming) {
    const actions = el("div", "msg-actions");
    if (msg.role === "user") actions.append(button("Edit", "edit", index));
    if (msg.role === "assistant") {
      actions.append(button("Copy", "copy", index));
      if (msg.request) actions.append(button("Raw", "raw", index));
      if (isLast) actions.append(button("Regenerate", "regenerate", index));
    }
    box.append(actions);
  }
  return box;
}

function toolCard(call) {
  const card = el("div", "tool-card");
  const fn = call.function || {};
  const head = el("div", "tool-head");
  head.append(el("span", "tool-label", "tool call"), el("span", "tool-name", fn.name || "?"));
  card.append(head);
  let args = fn.arguments || "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* still streaming */ }
  card.append(el("pre", "tool-args", args));
  if (call.id) card.append(el("div", "tool-id muted", call.id));
  return card;
}

// The edit form of a user turn: its text, and its images each with a remove button (the
// thumbnails left in the box when Send is pressed are the ones kept: data-image indexes
// msg.images).
export function editBox(msg, index) {
  const box = el("div", "msg user editing");
  box.dataset.index = index;
  if (msg.images && msg.images.length) {
    const thumbs = el("div", "thumbs");
    thumbs.append(...msg.images.map((im, j) =>
      thumbnail(im, { action: "drop-image", index, image: j })));
    box.append(thumbs);
  }
  const ta = el("textarea", "edit-text");
  ta.value = msg.content;
  ta.rows = Math.min(12, Math.max(2, msg.content.split("\n").length));
  const row = el("div", "msg-actions");
  row.append(button("Send", "resend", index), button("Cancel", "cancel-edit", index));
  box.append(ta, row);
  return box;
}
