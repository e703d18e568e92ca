// The settings panel: form <-> saved settings, and the request fields they make.

import { DEFAULT_SETTINGS, loadSettings, saveSettings } from "./store.js";

const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed",
                 "presence_penalty", "frequency_penalty", "repetition_penalty"];
const INTEGERS = new Set(["top_k", "max_tokens", "seed"]);

export class Settings {
  constructor(form, errorEl) {
    this.form = form;
    this.errorEl = errorEl;
    this.values = loadSettings();
    this.fill();
    form.addEventListener("input", () => this.read());
    form.addEventListener("change", () => this.read());
    form.querySelector("#reset-settings").addEventListener("click", () => {
      this.values = { ...DEFAULT_SETTINGS };
      saveSettings(this.values);
      this.fill();
    });
  }

  fill() {
    for (const [k, v] of Object.entries(this.values)) {
      const input = this.form.elements[k];
      if (input) input.value = v;
    }
    this.showFields();
  }

  read() {
    for (const k of Object.keys(DEFAULT_SETTINGS)) {
      const input = this.form.elements[k];
      if (input) this.values[k] = input.value;
    }
    saveSettings(this.values);
    this.showFields();
    try { this.requestFields(); this.errorEl.textContent = ""; }
    catch (e) { this.errorEl.textContent = e.message; }
  }

  showFields() {
    for (const el of this.form.querySelectorAll("[data-format]")) {
      el.hidden = el.dataset.format !== this.values.format;
    }
    for (const el of this.form.querySelectorAll("[data-choice]")) {
      el.hidden = el.dataset.choice !== this.values.tool_choice;
    }
  }

  // The request's fields from the settings (sampling, constraints, tools); Error on bad input.
  requestFields() {
    const v = this.values;
    const out = {};
    for (const k of NUMBERS) {
      const s = String(v[k] ?? "").trim();
      if (!s) continue;
      const n = Number(s);
      if (!Number.isFinite(n) || (INTEGERS.has(k) && !Number.isInteger(n))) {
        throw new Error(`${k} must be ${INTEGERS.has(k) ? "an integer" : "a number"}, got ${s}`);
      }
      out[k] = n;
    }
    const stop = lines(v.stop);
    if (stop.length) out.stop = stop;
    if (v.format === "json_schema") {
      let schema;
      try { schema = JSON.parse(v.json_schema); } catch (e) {
        throw new Error(`the JSON schema is not JSON: ${e.message}`);
      }
      out.response_format = { type: "json_schema", json_schema: { name: "output", schema } };
    } else if (v.format === "regex") {
      if (!v.regex) throw new Error("regex format: write a regular expression");
      out.structured_outputs = { regex: v.regex };
    } else if (v.format === "choice") {
      const choice = lines(v.choice);
      if (!choice.length) throw new Error("choice format: write at least one choice");
      out.structured_outputs = { choice };
    }
    if (v.tools.trim()) {
      let tools;
      try { tools = JSON.parse(v.tools); } catch (e) {
        throw new Error(`the tools are not JSON: ${e.message}`);
      }
      if (!Array.isArray(tools)) tools = [tools];
      out.tools = tools.map((t) => (t && t.type === "function" ? t : { type: "function", function: t }));
      for (const t of out.tools) {
        if (!t.function || typeof t.function.name !== "string") {
          throw new Error("each tool needs a function name: {\"name\": ..., \"parameters\": {...}}");
        }
      }
      if (v.tool_choice === "named") {
        if (!v.tool_name) throw new Error("tool_choice: name the function to call");
        out.tool_choice = { type: "function", function: { name: v.tool_name } };
      } else {
        out.tool_choice = v.tool_choice;
      }
    }
    return out;
  }
}

function lines(text) {
  return String(text || "").split("\n").map((s) => s.trim()).filter(Boolean);
}
