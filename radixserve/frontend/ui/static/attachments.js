// The composer's images: the attach button (file picker), paste into the prompt and drop onto
// the chat, the pending thumbnails (removable) and a one-line notice. The controls show only
// while the picked model reports "vision" in /v1/models; a dropped or pasted image otherwise
// gets a notice instead.

import { MAX_SIDE, readImage, thumbnail } from "./images.js";

const NOTICE_MS = 8000;

export class Attachments {
  // `els`: {button, input, list, notice, prompt, zone} (zone: where files may be dropped).
  constructor(els) {
    this.els = els;
    this.pending = [];
    this.vision = false;
    this.model = "";
    this.timer = 0;
    this.reading = Promise.resolve();
    els.button.addEventListener("click", () => els.input.click());
    els.input.addEventListener("change", () => {
      const files = [...els.input.files];
      els.input.value = "";
      this.add(files);
    });
    els.list.addEventListener("click", (ev) => {
      const b = ev.target.closest(".thumb-remove");
      if (!b) return;
      this.pending.splice(Number(b.dataset.image), 1);
      this.render();
    });
    els.prompt.addEventListener("paste", (ev) => {
      const files = [...(ev.clipboardData?.files || [])];
      if (!files.length) return;  // text: the textarea's own paste
      ev.preventDefault();
      this.add(files);
    });
    this.watchDrops(els.zone);
  }

  // A file dropped anywhere on the page must not replace it (the browser's default opens the
  // file); dropped on the zone it is attached.
  watchDrops(zone) {
    const hasFiles = (ev) => [...(ev.dataTransfer?.types || [])].includes("Files");
    document.addEventListener("dragover", (ev) => { if (hasFiles(ev)) ev.preventDefault(); });
    document.addEventListener("drop", (ev) => { if (hasFiles(ev)) ev.preventDefault(); });
    zone.addEventListener("dragover", (ev) => {
      if (!hasFiles(ev)) return;
      ev.dataTransfer.dropEffect = "copy";  // also for a text-only model: the drop says why not
      zone.classList.add("drop-target");
    });
    zone.addEventListener("dragleave", (ev) => {
      if (!zone.contains(ev.relatedTarget)) zone.classList.remove("drop-target");
    });
    zone.addEventListener("drop", (ev) => {
      zone.classList.remove("drop-target");
      if (hasFiles(ev)) this.add([...ev.dataTransfer.files]);
    });
  }

  // Show the controls for a model that takes images; hide them (dropping what is pending,
  // with a notice) for one that does not.
  setModel(model, vision) {
    this.model = model;
    this.vision = vision;
    this.els.button.hidden = !vision;
    if (!vision && this.pending.length) {
      this.pending = [];
      this.notify(`${model} takes text only: the attached images were removed`);
    }
    this.render();
  }

  // Read `files` in order; what cannot be attached is named in the notice.
  add(files) {
    this.reading = this.reading.then(() => this.read(files));
    return this.reading;
  }

  // Resolves once every file given to add() so far is read (or refused).
  ready() {
    return this.reading;
  }

  async read(files) {
    if (!files.length) return;
    if (!this.vision) {
      this.notify(`${this.model || "This model"} takes text only: images cannot be attached`);
      return;
    }
    const problems = [];
    const scaled = [];
    for (const file of files) {
      try {
        const im = await readImage(file);
        this.pending.push(im);
        if (im.scaled_from) scaled.push(`${im.name} downscaled to ${im.width}×${im.height}`);
      } catch (e) {
        problems.push(e.message);
      }
    }
    this.render();
    if (scaled.length) scaled[scaled.length - 1] += ` (longest side at most ${MAX_SIDE} px)`;
    this.notify([...problems, ...scaled].join("; "), problems.length > 0);
  }

  // The pending images, now owned by the caller; the composer is left empty.
  take() {
    const images = this.pending;
    this.pending = [];
    this.notify("");
    this.render();
    return images;
  }

  render() {
    const list = this.els.list;
    list.replaceChildren(...this.pending.map((im, j) =>
      thumbnail(im, { action: "remove-pending", index: -1, image: j })));
    list.hidden = !this.pending.length;
  }

  notify(text, isError = false) {
    const n = this.els.notice;
    n.textContent = text;
    n.classList.toggle("error", isError);
    n.hidden = !text;
    clearTimeout(this.timer);
    if (text) this.timer = setTimeout(() => { n.hidden = true; }, NOTICE_MS);
  }
}

export function takesImages(card) {
  return Boolean(card && Array.isArray(card.capabilities) &&
                 card.capabilities.includes("vision"));
}

// A click on a thumbnail's picture in `container` shows it whole in `dialog` (a .modal with an
// <img> and a <figcaption>); any click on the dialog closes it.
export function zoomOnClick(container, dialog) {
  container.addEventListener("click", (ev) => {
    const img = ev.target.closest(".thumb img");
    if (!img) return;
    dialog.querySelector("img").src = img.src;
    dialog.querySelector("figcaption").textContent = img.closest(".thumb").title;
    dialog.hidden = false;
  });
  dialog.addEventListener("click", () => { dialog.hidden = true; });
}
