// Small DOM and formatting helpers shared by the panels.

// el("div", {class: "x", dataset: {id: 3}, onclick: f}, child, "text", ...)
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "dataset") Object.entries(v).forEach(([dk, dv]) => { node.dataset[dk] = String(dv); });
    else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

// Make whitespace visible: a space is "·", a newline "↵", a tab "⇥".
export function visible(text) {
  return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
}

// One token piece as a chip: id underneath, special and byte pieces marked.
export function tokenChip(p, extra = {}) {
  const cls = ["tok", p.special ? "special" : "", p.bytes ? "bytepiece" : "", extra.class || ""].join(" ");
  return el("span", { ...extra, class: cls, title: extra.title || `id ${p.id} · bytes ${p.hex}`,
    dataset: { id: p.id, ...(extra.dataset || {}) } },
  el("span", { class: "piece" }, p.special || p.bytes ? p.text : visible(p.text)),
  el("span", { class: "tid" }, p.id));
}

export const pct = (p) => (p === null || p === undefined ? "–" : `${(100 * p).toFixed(p < 0.001 && p > 0 ? 3 : 1)}%`);
export const ms = (s) => (s === null || s === undefined ? "–" : `${(1000 * s).toFixed(1)} ms`);
export function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(2)} MiB`;
}

// A stable colour per request id (so one request has the same colour on every panel). FNV-1a then a
// golden-angle spread: ids that differ in one character (pg-…1, pg-…2) land far apart on the wheel.
export function hueOf(id) {
  let h = 0x811c9dc5;
  for (const ch of String(id)) { h ^= ch.charCodeAt(0); h = Math.imul(h, 0x01000193) >>> 0; }
  h ^= h >>> 15; h = Math.imul(h, 0x2c1b3c6d) >>> 0; h ^= h >>> 12;
  return Math.round(((h >>> 0) * 137.508) % 360);
}
export const colourOf = (id) => `hsl(${hueOf(id)} 65% 62%)`;

// Diverging colour for a signed value scaled to [-1, 1]: blue (negative), white (0), red (positive).
export function divColour(v) {
  const a = Math.max(-1, Math.min(1, v));
  const l = 100 - 45 * Math.abs(a);
  return a < 0 ? `hsl(215 75% ${l}%)` : `hsl(5 75% ${l}%)`;
}

// Sequential colour for a weight in [0, 1] (attention): white -> deep blue.
export const seqColour = (w) => `hsl(222 80% ${Math.round(100 - 62 * Math.max(0, Math.min(1, w)))}%)`;

// A request sequencer: `latest(fn)` runs fn() and resolves only if no later call started meanwhile
// (so a slow answer to an old slider position never overwrites a newer one).
export function sequencer() {
  let n = 0;
  return async (fn) => {
    const mine = ++n;
    const r = await fn();
    return mine === n ? r : undefined;
  };
}

// Colour for a probability: red (unlikely) -> green (likely).
export const probColour = (p) => `hsl(${Math.round(120 * Math.max(0, Math.min(1, p)))} 70% 80%)`;

// "live from the engine: <source>" badge each panel carries.
export const live = (source) => el("span", { class: "live" }, "live from the engine: ", el("code", {}, source));
