// The playground: conversations (store.js), settings (settings.js), and streamed chat over
// the server's own /v1/chat/completions; images (attachments.js) when the model takes them.

import { curlFor, getJSON, stream, withKey, askForKey } from "./api.js";
import { Attachments, takesImages, zoomOnClick } from "./attachments.js";
import { contentOf, elideImages, lostImageAt } from "./images.js";
import { editBox, renderMessage } from "./message_view.js";
import { Settings } from "./settings.js";
import { Store } from "./store.js";

const $ = (sel) => document.querySelector(sel);
const store = new Store();
const settings = new Settings($("#settings-form"), $("#settings-error"));
const attachments = new Attachments({
  button: $("#attach"), input: $("#attach-file"), list: $("#attach-list"),
  notice: $("#attach-notice"), prompt: $("#prompt"), zone: $("#chat") });
zoomOnClick($("#chat"), $("#image-dialog"));
let model = null;
let cards = [];  // /v1/models' entries: the picked one says whether images may be attached
let current = store.conversations[0] || store.create();
let running = null;  // {controller, message} while a reply streams
let editing = null;  // index of the user message being edited

// --- conversations ---------------------------------------------------------------------

function renderList() {
  const list = $("#conv-list");
  list.replaceChildren();
  for (const c of store.conversations) {
    const li = document.createElement("li");
    li.className = "conv" + (c.id === current.id ? " active" : "");
    li.dataset.id = c.id;
    const title = document.createElement("span");
    title.className = "conv-title";
    title.textContent = c.title;
    title.title = c.title;
    const rename = document.createElement("button");
    rename.type = "button"; rename.className = "conv-rename icon"; rename.textContent = "✎";
    rename.title = "rename";
    const del = document.createElement("button");
    del.type = "button"; del.className = "conv-delete icon"; del.textContent = "✕";
    del.title = "delete";
    li.append(title, rename, del);
    list.append(li);
  }
}

$("#conv-list").addEventListener("click", (ev) => {
  const li = ev.target.closest(".conv");
  if (!li) return;
  const id = li.dataset.id;
  if (ev.target.classList.contains("conv-delete")) {
    if (running && current.id === id) stop();
    store.remove(id);
    if (current.id === id) current = store.conversations[0] || store.create();
    renderAll();
  } else if (ev.target.classList.contains("conv-rename")) {
    const c = store.get(id);
    const input = document.createElement("input");
    input.className = "conv-rename-input";
    input.value = c.title;
    li.querySelector(".conv-title").replaceWith(input);
    input.focus();
    input.select();
    const done = (save) => {
      if (save) store.rename(id, input.value);
      renderList();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") done(true);
      if (e.key === "Escape") done(false);
    });
    input.addEventListener("blur", () => done(true));
  } else if (ev.target.tagName !== "INPUT" && id !== current.id) {
    if (running) stop();
    current = store.get(id);
    editing = null;
    renderAll();
    document.body.classList.remove("show-sidebar");
  }
});

$("#new-chat").addEventListener("click", () => {
  if (running) stop();
  current = store.conversations.find((c) => !c.messages.length) || store.create();
  editing = null;
  renderAll();
  $("#prompt").focus();
});

$("#export").addEventListener("click", () => {
  const blob = new Blob([store.exportJSON()], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `radixserve-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
});

$("#import-file").addEventListener("change", async (ev) => {
  const file = ev.target.files[0];
  ev.target.value = "";
  if (!file) return;
  const status = $("#import-status");
  try {
    const n = store.importJSON(await file.text());
    status.textContent = `imported ${n} conversation${n === 1 ? "" : "s"}`;
    status.classList.remove("error");
  } catch (e) {
    status.textContent = `import failed: ${e.message}`;
    status.classList.add("error");
  }
  renderList();
});

// --- messages --------------------------------------------------------------------------

function renderMessages() {
  const box = $("#messages");
  box.replaceChildren();
  const msgs = current.messages;
  if (!msgs.length) {
    const hint = document.createElement("div");
    hint.className = "empty muted";
    hint.textContent = model ? `Chat with ${model}.` : "Connecting…";
    box.append(hint);
  }
  msgs.forEach((m, i) => {
    const streaming = running !== null && running.message === m;
    box.append(i === editing ? editBox(m, i)
      : renderMessage(m, i, { streaming, isLast: i === msgs.length - 1 }));
  });
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderList();
  renderMessages();
  $("#send").hidden = running !== null;
  $("#stop").hidden = running === null;
}

// Re-render only the streaming message, at most once a frame.
let frame = 0;
function updateStreaming() {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    if (!running) return;
    const msgs = current.messages;
    const i = msgs.indexOf(running.message);
    const old = $(`#messages .msg[data-index="${i}"]`);
    if (!old) return;
    const box = $("#messages");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const fresh = renderMessage(running.message, i, { streaming: true });
    const wasOpen = old.querySelector("details.reasoning");
    const now = fresh.querySelector("details.reasoning");
    if (wasOpen && now && wasOpen.dataset.touched) { now.open = wasOpen.open; now.dataset.touched = "1"; }
    old.replaceWith(fresh);
    if (atBottom) box.scrollTop = box.scrollHeight;
  });
}

$("#messages").addEventListener("toggle", (ev) => {
  if (ev.target.matches("details.reasoning")) ev.target.dataset.touched = "1";
}, true);

$("#messages").addEventListener("click", (ev) => {
  const b = ev.target.closest(".msg-action");
  if (!b) return;
  const i = Number(b.dataset.index);
  const msg = current.messages[i];
  switch (b.dataset.action) {
    case "edit": editing = i; renderMessages(); break;
    case "cancel-edit": editing = null; renderMessages(); break;
    case "drop-image": b.closest(".thumb").remove(); break;
    case "resend": {
      const box = $(`#messages .msg[data-index="${i}"]`);
      const text = box.querySelector("textarea").value.trim();
      const images = [...box.querySelectorAll(".thumb[data-image]")]
        .map((t) => msg.images[Number(t.dataset.image)]);
      const msgs = [...current.messages.slice(0, i), userTurn(text, images)];
      if ((!text && !images.length) || !sendable(msgs)) return;
      editing = null;
      current.messages = msgs;
      generate();
      break;
    }
    case "regenerate":
      if (!sendable(current.messages.slice(0, i))) return;
      current.messages = current.messages.slice(0, i);
      generate();
      break;
    case "copy": navigator.clipboard?.writeText(msg.content || ""); break;
    case "raw": showRaw(msg.request); break;
  }
});

// --- generation ------------------------------------------------------------------------

function buildRequest() {
  const messages = [];
  const system = settings.values.system.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of current.messages) {
    if (m.role === "assistant") {
      const out = { role: "assistant", content: m.content || "" };
      if (m.tool_calls && m.tool_calls.length) out.tool_calls = m.tool_calls;
      messages.push(out);
    } else {
      messages.push({ role: m.role, content: contentOf(m) });
    }
  }
  return { model, messages, stream: true, stream_options: { include_usage: true },
           return_progress: true, ...settings.requestFields() };
}

function applyDelta(msg, delta) {
  if (delta.content) msg.content += delta.content;
  if (delta.reasoning_content) msg.reasoning = (msg.reasoning || "") + delta.reasoning_content;
  for (const t of delta.tool_calls || []) {
    msg.tool_calls = msg.tool_calls || [];
    const call = msg.tool_calls[t.index ?? 0] ||
      (msg.tool_calls[t.index ?? 0] = { id: "", type: "function", function: { name: "", arguments: "" } });
    if (t.id) call.id = t.id;
    if (t.function?.name) call.function.name += t.function.name;
    if (t.function?.arguments) call.function.arguments += t.function.arguments;
  }
}

// Whether `msgs` may be sent: not when an image of theirs was not kept (store.js), which
// the notice says.
function sendable(msgs) {
  const lost = lostImageAt(msgs);
  if (lost < 0) return true;
  attachments.notify(`Message ${lost + 1}'s image was not kept by this browser (storage full):` +
                     " edit that message to remove it, or start a new chat", true);
  return false;
}

async function generate() {
  let body;
  try { body = buildRequest(); } catch (e) {
    $("#settings-error").textContent = e.message;
    document.body.classList.add("show-settings");
    renderMessages();
    return;
  }
  const conv = current;
  const msg = { role: "assistant", content: "", reasoning: "", request: elideImages(body),
                stats: {} };
  conv.messages.push(msg);
  if (conv.title === "New chat") {
    const first = conv.messages.find((m) => m.role === "user");
    if (first) conv.title = first.content.slice(0, 48) || "Image";
  }
  const controller = new AbortController();
  running = { controller, message: msg };
  store.touch(conv);
  renderAll();
  const sent = performance.now();
  let first = null;
  let chunks = 0;
  try {
    await stream("/v1/chat/completions", body, (ev) => {
      if (ev.prompt_progress) {  // a prefill report, no text: shown until the first token
        if (first === null) msg.stats.prefill = ev.prompt_progress;
        updateStreaming();
        return;
      }
      if (ev.usage) {
        msg.stats.prompt_tokens = ev.usage.prompt_tokens;
        msg.stats.completion_tokens = ev.usage.completion_tokens;
        msg.stats.estimated = false;
      }
      for (const choice of ev.choices || []) {
        const d = choice.delta || {};
        if (d.content || d.reasoning_content || d.tool_calls) {
          if (first === null) {
            first = performance.now();
            msg.stats.ttft_ms = first - sent;
            delete msg.stats.prefill;
          }
          chunks++;
          if (!ev.usage && msg.stats.estimated !== false) {
            msg.stats.completion_tokens = chunks;  // the usage chunk at the end has the count
            msg.stats.estimated = true;
          }
        }
        applyDelta(msg, d);
        if (choice.finish_reason) msg.stats.finish_reason = choice.finish_reason;
      }
      updateStreaming();
    }, controller.signal);
  } catch (e) {
    if (e.name === "AbortError") {
      msg.stats.finish_reason = "stopped";
    } else {
      // the server's answer as it gave it (a 400: the image it refused, and why)
      msg.error = typeof e.status === "number" ? `${e.status}: ${e.message}` : e.message;
      if (e.status === 401) askForKey(loadModel, "The key was refused: " + e.message);
    }
  }
  delete msg.stats.prefill;  // a reply that ended before its first token
  const end = performance.now();
  const n = msg.stats.completion_tokens || 0;
  if (first !== null && n > 1 && end > first) msg.stats.tok_s = (n - 1) / ((end - first) / 1000);
  running = null;
  store.touch(conv);
  if (store.imagesDropped) {
    attachments.notify("This browser's storage is full: the conversations' images are kept " +
                       "until the page is reloaded (Export keeps them)", true);
  }
  if (conv === current) renderAll();
  if (cards.length > 1) refreshCards().catch(() => {});  // a model's capabilities once loaded
}

function stop() {
  if (running) running.controller.abort();
}

function userTurn(text, images) {
  return images.length ? { role: "user", content: text, images } : { role: "user", content: text };
}

async function send() {
  if (running) return;
  await attachments.ready();  // an image still being read goes with this turn
  const ta = $("#prompt");
  const text = ta.value.trim();
  if ((!text && !attachments.pending.length) || running || !sendable(current.messages)) return;
  ta.value = "";
  editing = null;
  current.messages.push(userTurn(text, attachments.take()));
  generate();
}

$("#composer").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
$("#prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
});
$("#stop").addEventListener("click", stop);

// --- raw request view ------------------------------------------------------------------

function showRaw(request) {
  const json = JSON.stringify(request, null, 2);
  const curl = curlFor("/v1/chat/completions", request);
  $("#raw-json").textContent = json;
  $("#raw-curl").textContent = curl;
  $("#copy-json").onclick = () => navigator.clipboard?.writeText(json);
  $("#copy-curl").onclick = () => navigator.clipboard?.writeText(curl);
  $("#raw-dialog").hidden = false;
}
$("#close-raw").addEventListener("click", () => { $("#raw-dialog").hidden = true; });

// --- layout ----------------------------------------------------------------------------

$("#toggle-sidebar").addEventListener("click", () => {
  document.body.classList.toggle("show-sidebar");
  document.body.classList.remove("show-settings");
});
$("#toggle-settings").addEventListener("click", () => {
  document.body.classList.toggle("show-settings");
  document.body.classList.remove("show-sidebar");
});

// --- start -----------------------------------------------------------------------------

const MODEL_KEY = "radixserve.model"; // the picked model; the engine view follows it

async function loadModel() {
  const list = await getJSON("/v1/models");
  cards = list.data;
  const ids = list.data.map((m) => m.id);
  const loaded = list.data.find((m) => m.status && m.status.value === "loaded");
  const saved = localStorage.getItem(MODEL_KEY);
  model = ids.includes(saved) ? saved : (loaded ? loaded.id : ids[0]);
  $("#model-name").textContent = ids.length > 1 ? "" : model;
  if (ids.length > 1) pickFrom(list.data);
  pickedModel();
  return model;
}

// With several models (serve --models-dir): a picker; the first request to one loads it.
function pickFrom(cards) {
  const pick = $("#model-pick");
  pick.replaceChildren(...cards.map((m) => {
    const state = m.status ? ` (${m.status.value})` : "";
    return new Option(m.id + state, m.id);
  }));
  pick.value = model;
  pick.hidden = false;
  pick.onchange = () => {
    model = pick.value;
    localStorage.setItem(MODEL_KEY, model);
    pickedModel();
    renderMessages();
  };
}

// --models-dir: a model's card says "vision" only once it is loaded (by the first request).
async function refreshCards() {
  cards = (await getJSON("/v1/models")).data;
  pickedModel();
}

function pickedModel() {
  attachments.setModel(model, takesImages(cards.find((c) => c.id === model)));
}

renderAll();
withKey(loadModel).then(() => renderMessages(), (e) => {
  $("#model-name").textContent = `server unreachable: ${e.message}`;
});

// for tests and the curious: render a message through the same path the chat uses
window.radixserve = { renderMessage, store };
