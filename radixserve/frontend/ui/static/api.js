// The server's own HTTP API as the pages use it: the API key (kept in sessionStorage, asked
// for when the server answers 401), JSON calls, and OpenAI-style SSE streams.

const KEY = "radixserve.apiKey";

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

async function failure(res) {
  let body = null;
  let message = `${res.status} ${res.statusText}`;
  try {
    body = await res.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON */ }
  return new ApiError(res.status, message, body);
}

export async function getJSON(path, signal) {
  const res = await fetch(path, { headers: headers(false), signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

export async function postJSON(path, body, signal) {
  const res = await fetch(path, { method: "POST", headers: headers(true),
                                  body: JSON.stringify(body), signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

// POST a streaming request; calls onEvent(obj) per `data:` event until [DONE].
// An `error` event (the server's in-stream error) is thrown as an ApiError.
export async function stream(path, body, onEvent, signal) {
  const res = await fetch(path, { method: "POST", headers: headers(true),
                                  body: JSON.stringify(body), signal });
  if (!res.ok) throw await failure(res);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new ApiError(obj.error.code || 500, obj.error.message, obj);
        onEvent(obj);
      }
    }
  }
}

// The request as a shell command (the key left as a variable: never copied into a clipboard).
export function curlFor(path, body) {
  const url = new URL(path, location.href).href;
  const quote = (s) => `'${s.replace(/'/g, `'\\''`)}'`;
  const lines = [`curl ${quote(url)}`, `  -H 'Content-Type: application/json'`];
  if (apiKey()) lines.push(`  -H "Authorization: Bearer $RADIXSERVE_API_KEY"`);
  if (body.stream) lines.push("  -N");
  lines.push(`  -d ${quote(JSON.stringify(body, null, 2))}`);
  return lines.join(" \\\n");
}

// Show the key dialog until `check()` (an API call) succeeds; resolves with its result.
export function askForKey(check, message) {
  const dialog = document.getElementById("key-dialog");
  const form = dialog.querySelector("form");
  const input = dialog.querySelector("input");
  const error = dialog.querySelector(".key-error");
  error.textContent = message || "";
  dialog.hidden = false;
  input.value = "";
  input.focus();
  return new Promise((resolve) => {
    form.onsubmit = async (ev) => {
      ev.preventDefault();
      setApiKey(input.value.trim());
      error.textContent = "checking…";
      try {
        const result = await check();
        dialog.hidden = true;
        form.onsubmit = null;
        resolve(result);
      } catch (e) {
        setApiKey("");
        error.textContent = e.status === 401 ? "Wrong key: " + e.message : e.message;
      }
    };
  });
}

// Run `check()`; on a 401 ask for the key (and retry through the dialog).
export async function withKey(check) {
  try {
    return await check();
  } catch (e) {
    if (e.status !== 401) throw e;
    return askForKey(check, apiKey() ? "The saved key was refused." : "");
  }
}
