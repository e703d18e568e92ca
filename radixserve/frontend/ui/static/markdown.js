// A small, safe Markdown renderer for model output: it builds DOM nodes (elements we choose,
// text always through text nodes / textContent), so nothing the model writes is ever parsed
// as HTML: `<script>` or `<img onerror=…>` in an answer is shown as those characters.
// Links keep only http(s) and mailto URLs. Covered: headings, paragraphs, fenced code (with
// highlighting; an unclosed fence while streaming still renders as code), inline code, bold,
// italic, strikethrough, links, bare URLs, lists (nested by indent), blockquotes, tables, rules.

import { highlightInto } from "./highlight.js";

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  blocks(text.replace(/\r\n?/g, "\n").split("\n"), root);
  return root;
}

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    ITEM.test(line) || (line.includes("|") && next !== undefined && TABLE_SEP.test(next));
}

function blocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i++; continue; }
    if ((m = FENCE.exec(line))) {
      const close = new RegExp(`^\\s{0,3}${m[1][0]}{${m[1].length},}\\s*$`);
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++;
      parent.append(codeBlock(body.join("\n"), m[2]));
    } else if ((m = HEADING.exec(line))) {
      const h = el(`h${m[1].length}`);
      inline(m[2], h);
      parent.append(h);
      i++;
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) body.push(lines[i].replace(QUOTE, ""));
      const q = el("blockquote");
      blocks(body, q);
      parent.append(q);
    } else if (ITEM.test(line)) {
      i = list(lines, i, parent);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      i = table(lines, i, parent);
    } else {
      const body = [line];
      for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines[i], lines[i + 1]); i++) {
        body.push(lines[i]);
      }
      const p = el("p");
      inline(body.join("\n"), p);
      parent.append(p);
    }
  }
}

function codeBlock(code, lang) {
  const wrap = el("div", "code-block");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || "text"));
  const copy = el("button", "code-copy", "copy");
  copy.type = "button";
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => { copy.textContent = "copied"; },
                                              () => { copy.textContent = "copy failed"; });
  });
  bar.append(copy);
  const pre = el("pre");
  const codeEl = el("code");
  highlightInto(codeEl, code, lang);
  pre.append(codeEl);
  wrap.append(bar, pre);
  return wrap;
}

function list(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const listEl = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) listEl.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    for (i++; i < lines.length; i++) {
      const next = lines[i];
      const sub = ITEM.exec(next);
      if (sub && sub[1].length <= indent) break;
      if (!next.trim()) {
        if (i + 1 < lines.length && /^\s+/.test(lines[i + 1]) && lines[i + 1].trim()) {
          body.push("");
          continue;
        }
        break;
      }
      if (!sub && !/^\s/.test(next) && startsBlock(next, lines[i + 1])) break;
      body.push(next.replace(new RegExp(`^\\s{0,${indent + 4}}`), ""));
    }
    const li = el("li");
    if (body.length === 1) inline(body[0], li);
    else blocks(body, li);
    listEl.append(li);
  }
  parent.append(listEl);
  return i;
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|")) s = s.slice(0, -1);
  return s.split("|").map((c) => c.trim());
}

function table(lines, i, parent) {
  const t = el("table");
  const head = el("thead");
  const row = el("tr");
  for (const c of cells(lines[i])) { const th = el("th"); inline(c, th); row.append(th); }
  head.append(row);
  t.append(head);
  const body = el("tbody");
  for (i += 2; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) {
    const tr = el("tr");
    for (const c of cells(lines[i])) { const td = el("td"); inline(c, td); tr.append(td); }
    body.append(tr);
  }
  t.append(body);
  const wrap = el("div", "table-wrap");
  wrap.append(t);
  parent.append(wrap);
  return i;
}

const INLINE = new RegExp([
  "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",   // 1,2 code
  "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",       // 3 bold
  "(?<![\\w])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w])", // 4 bold (not inside words)
  "~~(?=\\S)([\\s\\S]*?\\S)~~",               // 5 strike
  "\\*(?=[^\\s*])([^*\\n]*?[^\\s*])\\*",      // 6 italic
  "(?<![\\w])_(?=[^\\s_])([^_\\n]*?[^\\s_])_(?![\\w])", // 7 italic
  "\\[([^\\]\\n]+)\\]\\(\\s*([^)\\s]+)(?:\\s+\"[^\"]*\")?\\s*\\)", // 8,9 link
  "(https?:\\/\\/[^\\s<>()\\[\\]]+[^\\s<>()\\[\\].,;:!?'\"])", // 10 bare URL
].join("|"), "g");

function safeUrl(url) {
  try {
    const u = new URL(url, location.href);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch (_) {
    return null;
  }
}

function link(href, text, parent) {
  const url = safeUrl(href);
  if (!url) { parent.append(text); return; }
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  inline(text, a);
  parent.append(a);
}

// Append the inline Markdown of `text` to `parent` (text nodes and our own elements only).
export function inline(text, parent) {
  const re = new RegExp(INLINE.source, "g");
  let last = 0;
  for (let m; (m = re.exec(text)); ) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = re.lastIndex;
    if (m[2] !== undefined) parent.append(el("code", null, m[2]));
    else if (m[3] !== undefined || m[4] !== undefined) {
      const b = el("strong"); inline(m[3] ?? m[4], b); parent.append(b);
    } else if (m[5] !== undefined) {
      const s = el("del"); inline(m[5], s); parent.append(s);
    } else if (m[6] !== undefined || m[7] !== undefined) {
      const e = el("em"); inline(m[6] ?? m[7], e); parent.append(e);
    } else if (m[8] !== undefined) link(m[9], m[8], parent);
    else if (m[10] !== undefined) link(m[10], m[10], parent);
  }
  if (last < text.length) parent.append(text.slice(last));
}
