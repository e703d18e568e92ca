// The engine view: polls /v1/engine/state once a second and draws it. Throughput and
// latency come from differencing the metrics' running totals between polls. Under data
// parallel a selector shows all replicas (their sum, every request and tree) or one of them.

import { getJSON, withKey } from "./api.js";

const $ = (sel) => document.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
const HISTORY = 60;
const history = { tok: [], ttft: [], itl: [] };
let previous = null;
let chosen = "all"; // "all" or a replica's index, as the selector's value

function text(sel, value) { $(sel).textContent = value; }

function ms(seconds) {
  if (seconds === null || !Number.isFinite(seconds)) return "–";
  return seconds < 1 ? `${Math.round(seconds * 1000)} ms` : `${seconds.toFixed(2)} s`;
}

function spark(id, values) {
  const line = $(`#${id} polyline`);
  const finite = values.filter((v) => v !== null);
  const max = Math.max(1e-9, ...finite);
  const pts = values.map((v, i) => v === null ? null
    : `${(i * 120) / (HISTORY - 1)},${38 - (v / max) * 36}`).filter(Boolean);
  line.setAttribute("points", pts.join(" "));
}

function push(list, v) {
  list.push(v);
  if (list.length > HISTORY) list.shift();
}

function rates(s) {
  const t = s.totals;
  if (previous) {
    const p = previous.totals;
    const dt = s.time - previous.time;
    const tok = dt > 0 ? (t.generation_tokens - p.generation_tokens) / dt : 0;
    const mean = (sum, count) => (t[count] - p[count] > 0
      ? (t[sum] - p[sum]) / (t[count] - p[count]) : null);
    push(history.tok, tok);
    push(history.ttft, mean("ttft_sum", "ttft_count"));
    push(history.itl, mean("itl_sum", "itl_count"));
    text("#tok-s", tok.toFixed(1));
    const last = (list) => [...list].reverse().find((v) => v !== null) ?? null;
    text("#ttft", ms(last(history.ttft)));
    text("#itl", ms(last(history.itl)));
    spark("spark-tok", history.tok);
    spark("spark-ttft", history.ttft);
    spark("spark-itl", history.itl);
  }
  previous = s;
}

function cell(row, value, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  if (value instanceof Node) td.append(value); else td.textContent = value;
  row.append(td);
}

function requests(s) {
  const body = $("#req-rows");
  body.replaceChildren();
  for (const r of [...s.running, ...s.waiting]) {
    const tr = document.createElement("tr");
    tr.className = `req-row ${r.status}`;
    tr.dataset.id = r.id;
    cell(tr, r.id, "id");
    cell(tr, `r${r.replica}`, "dp-only");
    cell(tr, r.status);
    const wrap = document.createElement("span");
    const bar = document.createElement("span");
    bar.className = "progress";
    const fill = document.createElement("div");
    fill.style.width = `${r.tokens ? (100 * r.computed) / r.tokens : 0}%`;
    bar.append(fill);
    wrap.append(bar, ` ${r.computed} / ${r.tokens}`);
    cell(tr, wrap);
    cell(tr, `${r.output_tokens} / ${r.max_tokens}`);
    cell(tr, r.cached_tokens);
    cell(tr, r.priority);
    cell(tr, `${r.age_s.toFixed(1)} s`);
    body.append(tr);
  }
  const hidden = s.num_running - s.running.length + s.num_waiting - s.waiting.length;
  text("#req-more", hidden > 0 ? `and ${hidden} more` : "");
}

function kv(s) {
  const k = s.kv;
  const total = k.num_blocks || 1;
  const [used, cached] = $("#kv-bar").children;
  used.style.width = `${(100 * k.used) / total}%`;
  cached.style.width = `${(100 * k.cached_evictable) / total}%`;
  text("#kv-used", k.used);
  text("#kv-cached", k.cached_evictable);
  text("#kv-free", k.free);
  text("#kv-total", k.num_blocks);
  text("#kv-block-size", k.block_size);
}

function svg(tag, attrs, content) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (content !== undefined) e.textContent = content;
  return e;
}

// Left to right by depth; leaves take rows in order, a parent sits level with its first child.
function tree(s) {
  const nodes = s.prefix_cache.nodes;
  const el = $("#tree");
  el.replaceChildren();
  text("#tree-count", `${nodes.length} of ${s.prefix_cache.num_nodes} nodes shown`);
  const W = 190, H = 46, GX = 36, GY = 10;
  const kids = nodes.map(() => []);
  const roots = [];
  nodes.forEach((n, i) => (n.parent < 0 ? roots : kids[n.parent]).push(i));
  const row = new Array(nodes.length);
  let next = 0;
  const place = (i) => {
    if (!kids[i].length) { row[i] = next++; return; }
    kids[i].forEach(place);
    row[i] = row[kids[i][0]];
    if (nodes[i].num_hidden_children > 0) next++;
  };
  roots.forEach(place);
  const rows = Math.max(1, next);
  const depth = Math.max(0, ...nodes.map((n) => n.depth)) + 1;
  el.setAttribute("width", 40 + depth * (W + GX));
  el.setAttribute("height", rows * (H + GY) + 10);
  const x = (i) => 30 + nodes[i].depth * (W + GX);
  const y = (i) => 5 + row[i] * (H + GY);
  const rootY = nodes.length ? y(roots[0]) + H / 2 : 20;
  el.append(svg("circle", { cx: 12, cy: rootY, r: 6, fill: "var(--muted)" }));
  nodes.forEach((n, i) => {
    const [px, py] = n.parent < 0 ? [18, rootY] : [x(n.parent) + W, y(n.parent) + H / 2];
    const cy = y(i) + H / 2;
    el.append(svg("path", { d: `M${px},${py} C${px + GX / 2},${py} ${x(i) - GX / 2},${cy} ${x(i)},${cy}` }));
  });
  nodes.forEach((n, i) => {
    const cls = ["cache-node", n.hits > 0 ? "shared" : "", n.lock_ref > 0 ? "locked" : ""].join(" ");
    const g = svg("g", { class: cls, transform: `translate(${x(i)},${y(i)})`,
                         "data-hits": n.hits, "data-tokens": n.num_tokens, "data-locks": n.lock_ref });
    g.append(svg("rect", { width: W, height: H, rx: 6 }));
    const preview = n.preview.replace(/\s+/g, " ").trim();
    g.append(svg("text", { x: 8, y: 17 }, preview.length > 26 ? preview.slice(0, 25) + "…" : preview || "·"));
    const lock = n.lock_ref > 0 ? ` · locked ×${n.lock_ref}` : "";
    const state = n.snapshot ? " · state" : "";  // a hybrid model can resume at its end
    g.append(svg("text", { x: 8, y: 35, class: "sub" }, `${n.num_tokens} tok · ${n.hits} hits${lock}${state}`));
    const where = s.data_parallel_size > 1 ? `replica ${n.replica}: ` : "";
    g.append(svg("title", {}, `${where}${n.preview}\n${n.num_tokens} tokens in ${n.num_blocks} blocks, ${n.hits} hits, ${n.lock_ref} locks, ${n.num_children} children${n.snapshot ? ", recurrent state kept at its end" : ""}`));
    el.append(g);
    if (n.num_hidden_children > 0) {
      el.append(svg("text", { x: x(i) + W + 8, y: y(i) + H + GY + 14, class: "sub" },
                    `+${n.num_hidden_children} more`));
    }
  });
}

// The selector's options follow the replicas (one marked while it is down); the view drawn is
// the chosen replica's, or null while it is down.
function pick(s) {
  const multi = s.data_parallel_size > 1;
  $("#replica-pick").hidden = !multi;
  $("#reqs").classList.toggle("dp", multi);
  if (!multi) return s;
  const select = $("#replica");
  const labels = [`all (${s.replicas.length})`,
                  ...s.replicas.map((r) => `replica ${r.replica}${r.up ? "" : " (down)"}`)];
  if (select.options.length !== labels.length) {
    select.replaceChildren(...labels.map((label, i) => new Option(label, i ? String(i - 1) : "all")));
    select.value = chosen;
  }
  labels.forEach((label, i) => { select.options[i].textContent = label; });
  if (chosen === "all") return s;
  const r = s.replicas[Number(chosen)];
  return r.up ? { ...r, model: s.model, data_parallel_size: s.data_parallel_size } : null;
}

function draw(s) {
  text("#model-name", s.model);
  rates(s);
  const v = pick(s);
  if (v === null) {
    text("#status", `replica ${chosen} is down: ${s.replicas[Number(chosen)].error}`);
    return;
  }
  drawView(v);
}

function drawView(s) {
  text("#num-running", s.num_running);
  text("#num-waiting", s.num_waiting);
  text("#num-preemptions", s.num_preemptions);
  text("#hit-rate", `${(100 * s.prefix_cache.hit_rate).toFixed(1)} %`);
  kv(s);
  requests(s);
  tree(s);
  text("#status", `live · summary ${Math.round(s.summary_us)} µs`);
}

// with several models (serve --models-dir): the one picked in the playground
const picked = localStorage.getItem("radixserve.model");
const poll = () => getJSON("/v1/engine/state" +
                           (picked ? `?model=${encodeURIComponent(picked)}` : ""));

async function loop() {
  for (;;) {
    const started = Date.now();
    try {
      draw(await poll());
    } catch (e) {
      if (e.status === 401) { draw(await withKey(poll)); continue; }
      text("#status", `error: ${e.message}`);
    }
    await new Promise((r) => setTimeout(r, Math.max(100, 1000 - (Date.now() - started))));
  }
}

$("#replica").addEventListener("change", (e) => {
  chosen = e.target.value;
  const v = previous && pick(previous); // redraw the last poll's data at once
  if (v) drawView(v);
});

withKey(poll).then((s) => { draw(s); setTimeout(loop, 1000); },
                   (e) => text("#status", `error: ${e.message}`));
