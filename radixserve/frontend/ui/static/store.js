// Conversations and settings in localStorage (this browser only), and their JSON export /
// import. A conversation: {id, title, created, updated, messages: [{role, content, images?,
// reasoning?, tool_calls?, stats?, error?, request?}]} (images: see images.js).

import { isImageDataUrl } from "./images.js";

const CONVS = "radixserve.conversations";
const SETTINGS = "radixserve.settings";
export const EXPORT_KIND = "radixserve.conversations";

export const DEFAULT_SETTINGS = {
  system: "", temperature: "", top_p: "", top_k: "", min_p: "", max_tokens: "512",
  seed: "", presence_penalty: "", frequency_penalty: "", repetition_penalty: "", stop: "",
  format: "none", json_schema: "", regex: "", choice: "",
  tools: "", tool_choice: "auto", tool_name: "",
};

function read(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v ?? fallback;
  } catch (_) {
    return fallback;
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) };
}

export function saveSettings(s) {
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export class Store {
  constructor() {
    this.conversations = read(CONVS, []).filter(isConversation);
  }

  // NOTE: images are what fills the few MB a browser gives a page. When the whole does not
  // fit, it is saved without the images' data (the text is kept; `imagesDropped` is set and
  // the images stay in memory until a reload).
  save() {
    try {
      localStorage.setItem(CONVS, JSON.stringify(this.conversations));
      this.imagesDropped = false;
    } catch (e) {
      if (e.name !== "QuotaExceededError") throw e;
      const noImages = (k, v) => (k === "url" && isImageDataUrl(v) ? undefined : v);
      localStorage.setItem(CONVS, JSON.stringify(this.conversations, noImages));
      this.imagesDropped = true;
    }
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  create() {
    const now = Date.now();
    const c = { id: newId(), title: "New chat", created: now, updated: now, messages: [] };
    this.conversations.unshift(c);
    this.save();
    return c;
  }

  touch(c) {
    c.updated = Date.now();
    this.conversations.sort((a, b) => b.updated - a.updated);
    this.save();
  }

  rename(id, title) {
    const c = this.get(id);
    if (c && title.trim()) { c.title = title.trim().slice(0, 200); this.save(); }
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.save();
  }

  exportJSON() {
    return JSON.stringify({ kind: EXPORT_KIND, version: 1, exported: new Date().toISOString(),
                            conversations: this.conversations }, null, 2);
  }

  // Add the conversations of an export (a clash of ids gets a new id); returns how many.
  // Error naming what is expected when the text is not an export.
  importJSON(text) {
    let data;
    try { data = JSON.parse(text); } catch (e) { throw new Error(`not JSON: ${e.message}`); }
    const list = Array.isArray(data) ? data : data && data.conversations;
    if (!Array.isArray(list)) throw new Error(`expected {"kind": "${EXPORT_KIND}", "conversations": [...]}`);
    const good = list.filter(isConversation);
    if (good.length !== list.length) throw new Error(`${list.length - good.length} entries are not conversations (id, title, messages[]; images as data:image URIs)`);
    for (const c of good) {
      if (this.get(c.id)) c.id = newId();
      c.updated = c.updated || Date.now();
      this.conversations.push(c);
    }
    this.conversations.sort((a, b) => b.updated - a.updated);
    this.save();
    return good.length;
  }
}

function isConversation(c) {
  return c && typeof c.id === "string" && typeof c.title === "string" &&
    Array.isArray(c.messages) &&
    c.messages.every((m) => m && typeof m.role === "string" &&
      typeof (m.content ?? "") === "string" && (m.images === undefined || isImages(m.images)));
}

// A turn's images: each a data:image URI (or none: not kept, see save()); never a URL that a
// thumbnail would fetch.
function isImages(images) {
  return Array.isArray(images) && images.every((im) => im && typeof im === "object" &&
    (im.url === undefined || isImageDataUrl(im.url)));
}
