// Images in the chat: a picked / pasted / dropped file read into a data URI (downscaled here
// only when a side is over MAX_SIDE), the OpenAI content parts a user turn is sent as, the
// thumbnails, and the request copy kept for the Raw view with the image data elided (a
// conversation lives in localStorage, whose few MB would otherwise hold every image once per
// turn).
//
// An image of a message: {url: "data:image/...;base64,...", name, width, height,
// scaled_from?: [width, height]}; `url` is absent when the browser's storage was too full to
// keep it (store.js), and such a turn cannot be sent again.

export const MAX_SIDE = 2048;  // the servers' processors shrink far below this (Gemma 3: 896)
const DATA_IMAGE = /^data:image\/[a-z0-9.+-]+;base64,[a-z0-9+/]+=*$/i;

export function isImageDataUrl(url) {
  return typeof url === "string" && DATA_IMAGE.test(url);
}

function fileDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// The image of `file` as above: its own bytes when both sides are at most MAX_SIDE, else
// redrawn at MAX_SIDE on the longer side (PNG stays PNG, anything else becomes JPEG).
// Throws an Error naming the file when it is not an image the browser can decode.
export async function readImage(file) {
  const name = file.name || "image";
  if (!file.type.startsWith("image/")) {
    throw new Error(`${name}: not an image (${file.type || "unknown type"})`);
  }
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch (_) {
    throw new Error(`${name}: this browser cannot read it as an image`);
  }
  try {
    const { width, height } = bitmap;
    const side = Math.max(width, height);
    if (side <= MAX_SIDE) return { url: await fileDataUrl(file), name, width, height };
    const w = Math.max(1, Math.round((width * MAX_SIDE) / side));
    const h = Math.max(1, Math.round((height * MAX_SIDE) / side));
    const canvas = document.createElement("canvas");
    canvas.width = w;
    canvas.height = h;
    canvas.getContext("2d").drawImage(bitmap, 0, 0, w, h);
    const type = file.type === "image/png" ? "image/png" : "image/jpeg";
    return { url: canvas.toDataURL(type, 0.92), name, width: w, height: h,
             scaled_from: [width, height] };
  } finally {
    bitmap.close();
  }
}

// A stored user turn as OpenAI chat content: a plain string without images, else the image
// parts (in the order attached) then the text part.
export function contentOf(msg) {
  if (!msg.images || !msg.images.length) return msg.content;
  const parts = msg.images.map((im) => ({ type: "image_url", image_url: { url: im.url } }));
  if (msg.content) parts.push({ type: "text", text: msg.content });
  return parts;
}

// Index of the first message with an image the browser did not keep, or -1.
export function lostImageAt(messages) {
  return messages.findIndex((m) => (m.images || []).some((im) => !isImageDataUrl(im.url)));
}

// A copy of a request with every image data URI cut to its header and its size.
export function elideImages(body) {
  return JSON.parse(JSON.stringify(body, (key, v) => {
    if (key !== "url" || !isImageDataUrl(v)) return v;
    const head = v.slice(0, v.indexOf(",") + 1);
    return `${head}… (${Math.round((v.length - head.length) / 1024)} KiB of base64 elided)`;
  }));
}

export function describe(im) {
  let text = im.name || "image";
  if (im.width) text += ` · ${im.width}×${im.height}`;
  if (im.scaled_from) text += ` (downscaled from ${im.scaled_from[0]}×${im.scaled_from[1]})`;
  if (!isImageDataUrl(im.url)) text += " · not kept: the browser's storage was full";
  return text;
}

// A thumbnail; with `remove` ({action, index, image}) it carries a remove button whose
// data-action / data-index / data-image say what to drop.
export function thumbnail(im, remove) {
  const box = document.createElement("figure");
  box.className = "thumb";
  box.title = describe(im);
  if (isImageDataUrl(im.url)) {
    const img = document.createElement("img");
    img.alt = im.name || "image";
    img.src = im.url;  // only data:image URIs: a stored or imported URL never fetches
    box.append(img);
  } else {
    box.classList.add("lost");
    box.textContent = "image not kept";
  }
  if (im.scaled_from) box.classList.add("scaled");
  if (remove) {
    box.dataset.image = remove.image;
    const b = document.createElement("button");
    b.type = "button";
    b.className = "thumb-remove msg-action";
    b.dataset.action = remove.action;
    b.dataset.index = remove.index;
    b.dataset.image = remove.image;
    b.textContent = "×";
    b.title = "remove";
    box.append(b);
  }
  return box;
}
