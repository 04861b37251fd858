// Inside the model, panels 13-14: a token's embedding (its real row of the table) and the rotary
// positions (RoPE) of the real model. Drawn from /trace* (hitenter/server/playground_trace.py).
import { el, clear, visible, live, divColour, tokenChip, sequencer } from "./util.js";
import { postJSON } from "./api.js";

// A row of token chips; `onPick(i)` on click, `sel` outlined.
export function traceTokens(tr, { sel = null, onPick = null, id = null, weights = null } = {}) {
  return el("div", { class: "row tracetoks", id }, tr.pieces.map((p, i) => tokenChip(p, {
    class: `${i === sel ? "chosen-branch" : ""} ${i >= tr.num_prompt ? "generated" : ""}`,
    dataset: { index: i, w: weights ? weights[i] ?? 0 : "" },
    style: weights ? { background: `rgba(47,111,222,${Math.min(1, (weights[i] ?? 0) * 1.6).toFixed(3)})` } : {},
    onclick: onPick ? () => onPick(i) : null })));
}

// A vector as a strip of coloured cells on a canvas (one column per dimension, scaled by the max |x|).
export function strip(vec, { height = 26, width = 560 } = {}) {
  const c = el("canvas", { width: vec.length, height: 1, class: "strip", style: { height: `${height}px`, width: `${width}px` } });
  const ctx = c.getContext("2d");
  const m = Math.max(1e-9, ...vec.map(Math.abs));
  vec.forEach((v, i) => { ctx.fillStyle = divColour(v / m); ctx.fillRect(i, 0, 1, 1); });
  return c;
}

const embSeq = sequencer();

// Probe the table with a typed word: its own row (the first token of " word") and the rows nearest it, kept in
// S.probe across the panel's redraws.
function probeBox(S) {
  const P = S.probe || (S.probe = { word: "king", r: null, error: null });
  const input = el("input", { type: "text", id: "probe-word", value: P.word, size: 12, oninput: () => { P.word = input.value; } });
  const out = el("div", { id: "probe-out" });
  const draw = () => {
    if (P.error) { clear(out, el("p", { class: "err", id: "probe-error" }, P.error)); return; }
    if (!P.r) { clear(out, el("p", { class: "note" }, "type a word (king, python, Paris…) and look at its neighbours")); return; }
    const r = P.r;
    clear(out, el("div", { id: "probe", dataset: { word: r.word, id: r.id, norm: r.norm, model: r.model,
      nearest: JSON.stringify(r.nearest.map((n) => n.piece.id)), cos: JSON.stringify(r.nearest.map((n) => n.cos)) } },
    el("p", {}, `“${r.word}” is `, r.pieces.map((p) => tokenChip(p)), r.pieces.length > 1 ? ` (${r.pieces.length} tokens: the first one's row)` : "",
      `: row ${r.id}. Nearest rows by cosine similarity:`),
    el("div", { class: "row" }, r.nearest.map((n) => el("span", { class: "near" }, tokenChip(n.piece), el("small", {}, n.cos.toFixed(3)))))));
  };
  const go = async () => {
    P.error = null;
    try { P.r = { ...(await postJSON("/trace/probe", { model: S.modelName, word: P.word })), model: S.modelName }; } catch (e) {
      P.r = null; P.error = `probe: ${e.message.replace(/^[^{]*\{"detail":"?|"?\}$/g, "")}`;
    }
    draw();
  };
  if (P.r && P.r.model !== S.modelName) P.r = null;       // another model's table: not this one's neighbours
  draw();
  return el("div", { class: "probe" }, el("p", {}, el("b", {}, "probe a word: "), input, " ",
    el("button", { id: "btn-probe", onclick: go }, "nearest rows")), out);
}
export async function renderEmbedding(body, S, index = null) {
  const tr = S.trace;
  if (!tr) { clear(body, live("the model's embedding table"), el("p", { class: "note" }, "Press Enter to trace the prompt.")); return; }
  const i = index ?? S.embSel ?? tr.num_prompt - 1;
  S.embSel = i;
  const e = await embSeq(() => postJSON("/trace/embedding", { trace_id: tr.trace_id, index: i }));
  if (!e) return;
  clear(body, live("engine.runner.model.embed: the token's row of the real table"),
    el("p", { class: "note" }, "Click a token: its id picks one row of a table with ", el("b", {}, tr.vocab), " rows of ",
      el("b", {}, tr.dim), " numbers. That row is all the model knows about the token before it reads the context."),
    traceTokens(tr, { sel: i, onPick: (j) => renderEmbedding(body, S, j) }),
    el("div", { id: "embedding", dataset: { index: i, id: e.piece.id, norm: e.norm, dim: e.vector.length,
      nearest: JSON.stringify(e.nearest.map((n) => n.piece.id)) } },
    el("p", {}, el("code", {}, visible(e.piece.text)), ` → row ${e.piece.id}: ${e.vector.length} numbers, length (L2 norm) ${e.norm.toFixed(3)}`),
    strip(e.vector),
    el("p", { class: "note" }, "each column is one dimension: blue negative, red positive (scaled to the largest)."),
    el("p", {}, el("b", {}, "nearest rows by cosine similarity"), " (tokens the model learned to treat alike):"),
    el("div", { class: "row" }, e.nearest.map((n) => el("span", { class: "near" }, tokenChip(n.piece), el("small", {}, n.cos.toFixed(3)))))),
    probeBox(S));
}

// A small SVG line chart: points [[x, y]] in data units.
export function lineChart(points, { w = 420, h = 120, yMin = null, yMax = null, label = "" } = {}) {
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = yMin ?? Math.min(...ys), y1 = yMax ?? Math.max(...ys);
  const sx = (x) => 30 + ((x - x0) / Math.max(1e-9, x1 - x0)) * (w - 40), sy = (y) => h - 18 - ((y - y0) / Math.max(1e-9, y1 - y0)) * (h - 28);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "chart");
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(ns, tag);
    Object.entries(attrs).forEach(([k, v]) => n.setAttribute(k, v));
    if (text !== undefined) n.textContent = text;
    svg.append(n);
  };
  add("line", { x1: 30, y1: sy(0 >= y0 && 0 <= y1 ? 0 : y0), x2: w - 10, y2: sy(0 >= y0 && 0 <= y1 ? 0 : y0), class: "axis" });
  add("polyline", { points: points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "), class: "line" });
  add("text", { x: 30, y: h - 4, class: "tick" }, String(x0));
  add("text", { x: w - 10, y: h - 4, class: "tick", "text-anchor": "end" }, `${x1} ${label}`);
  add("text", { x: 2, y: 12, class: "tick" }, y1.toFixed(2));
  return svg;
}

// Positions: each dimension pair of a query/key is rotated by position × its own frequency.
export async function renderRope(body, S) {
  const m = S.modelName;
  const r = S.rope && S.rope.model === m ? S.rope : { model: m, ...(await postJSON("/trace/rope", { model: m, positions: 32, max_distance: 256 })) };
  S.rope = r;
  const pairs = r.inv_freq.length, showPairs = Math.min(pairs, 32), step = Math.max(1, Math.floor(pairs / showPairs));
  const grid = el("div", { class: "ropegrid", style: { gridTemplateColumns: `repeat(${r.angles.length}, 1fr)` } });
  for (let k = 0; k < showPairs; k++) {
    const pi = k * step;
    r.angles.forEach((row, pos) => {
      const a = row[pi];
      grid.append(el("div", { class: "dial", title: `pair ${pi}, position ${pos}: ${a.toFixed(2)} rad`,
        style: { transform: `rotate(${(-a * 180) / Math.PI}deg)` } }));
    });
  }
  clear(body, live("engine.runner.model.rope: the model's own frequencies"),
    el("p", { class: "note" }, `Attention only compares vectors, so where a token sits must be written into them. RoPE splits each `
      + `${r.head_dim}-number query and key into ${pairs} pairs and turns pair i by position × θ_i (θ_i = base^(−2i/${r.head_dim})).`),
    el("p", { id: "rope", dataset: { pairs, fastest: r.inv_freq[0], slowest: r.inv_freq[pairs - 1] } },
      el("b", {}, "rows: dimension pairs (fast at the top) · columns: positions 0–" + (r.angles.length - 1)),
      " · each hand is the pair's rotation at that position."),
    grid,
    el("p", {}, el("b", {}, "the same query and key, moved apart: "), "their score (mean over pairs of cos(distance × θ_i)) falls as they drift apart; "
      + "only the relative distance matters, not where they are."),
    lineChart(r.decay.map((y, d) => [d, y]), { label: "tokens apart", yMin: Math.min(0, ...r.decay), yMax: 1 }));
}
