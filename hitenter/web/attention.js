// Inside the model, panel 15: attention probabilities per layer and head (softmax(QKᵀ/√d + causal mask)),
// a heatmap with a layer slider and head picker; hover a token to see where it looks. Plus the
// "bank" comparison from the article: the same word in two sentences, pulled apart layer by layer.
import { el, clear, visible, live, seqColour, sequencer } from "./util.js";
import { postJSON } from "./api.js";
import { traceTokens, lineChart } from "./inside.js";

const attnSeq = sequencer();
const gridSeq = sequencer();

// Every layer × head for one query token: each cell shaded by the most weight it puts on one earlier token other
// than itself and the first (the attention sink); click a cell to open that head above.
async function headGrid(node, tr, A, open) {
  const q = A.q;
  const h = A.heads && A.heads.index === q ? A.heads : await gridSeq(() => postJSON("/trace/heads", { trace_id: tr.trace_id, index: q }));
  if (!h) return;
  A.heads = h;
  const cells = h.probs.map((heads, l) => heads.map((row, hd) => {
    const inner = row.slice(1, Math.max(1, q));
    const m = inner.length ? Math.max(...inner) : 0;
    const k = inner.indexOf(m) + 1;
    return el("div", { class: `hcell ${l === A.layer && hd === A.head ? "on" : ""}`, dataset: { layer: l, head: hd, p: m },
      title: `layer ${l + 1}, head ${hd}: ${(100 * m).toFixed(0)}% on “${visible(tr.pieces[k] ? tr.pieces[k].text : "")}”`,
      style: { background: seqColour(m) }, onclick: () => open(l, hd) });
  }));
  const best = h.strongest;
  clear(node, el("p", { class: "note" }, `every layer (rows) × head (columns) for “${visible(tr.pieces[q].text)}”: darker = more weight on one `
    + "earlier token (not itself, not the first token, which soaks up spare attention). Click a cell to open it. ",
  best ? el("button", { id: "attn-jump", dataset: { layer: best.layer, head: best.head, k: best.k },
    onclick: () => open(best.layer, best.head) }, `jump to its strongest head (layer ${best.layer + 1}, head ${best.head}: `
      + `${(100 * best.p).toFixed(0)}% on “${visible(tr.pieces[best.k].text)}”)`) : null),
  el("div", { class: "hgrid", id: "attn-grid", dataset: { q, layers: h.probs.length, heads: h.probs[0].length },
    style: { gridTemplateColumns: `repeat(${h.probs[0].length}, 12px)` } }, cells));
}

function heatmap(tr, probs, onHover) {
  const t = probs.length;
  const lab = (p) => (p.special ? p.text : visible(p.text)).slice(0, 10);
  const grid = el("div", { class: "heat", id: "attn-heat", style: { gridTemplateColumns: `7em repeat(${t}, minmax(6px, 1fr))` } });
  grid.append(el("div", {}));
  tr.pieces.slice(0, t).forEach((p, k) => grid.append(el("div", { class: "klab", title: p.text }, lab(p))));
  probs.forEach((row, q) => {
    grid.append(el("div", { class: "qlab", dataset: { q }, onmouseenter: () => onHover(q) }, lab(tr.pieces[q])));
    row.forEach((w, k) => grid.append(el("div", { class: `cell ${k > q ? "masked" : ""}`, dataset: { q, k, p: w },
      title: `${visible(tr.pieces[q].text)} → ${visible(tr.pieces[k].text)}: ${(100 * w).toFixed(1)}%`,
      style: { background: k > q ? "" : seqColour(w) }, onmouseenter: () => onHover(q) })));
  });
  return grid;
}

export async function renderAttention(body, S) {
  const tr = S.trace;
  if (!tr) { clear(body, live("attention probabilities of a traced forward"), el("p", { class: "note" }, "Press Enter to trace the prompt.")); return; }
  let A = S.attn && S.attn.trace_id === tr.trace_id ? S.attn : null;
  if (!A) {                // a new trace opens where the last prompt token looks hardest (not layer 1, head 0)
    A = S.attn = { trace_id: tr.trace_id, layer: 0, head: 0, q: tr.num_prompt - 1, cache: {} };
    const h = await gridSeq(() => postJSON("/trace/heads", { trace_id: tr.trace_id, index: A.q })).catch(() => null);
    if (h && h.strongest) Object.assign(A, { layer: h.strongest.layer, head: h.strongest.head, heads: h });
  }
  const data = A.cache[A.layer] || await attnSeq(() => postJSON("/trace/attention", { trace_id: tr.trace_id, layer: A.layer }));
  if (!data) return;
  A.cache[A.layer] = data;
  const probs = data.probs[A.head];
  const looks = el("div", { id: "attn-looks" });
  const hover = (q) => {
    A.q = q;
    const w = probs[q];
    const top = w.map((p, k) => [p, k]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    clear(looks, el("p", { class: "note", id: "attn-focus", dataset: { q, top: top[0][1] } },
      `“${visible(tr.pieces[q].text)}” (query ${q}) looks most at: `,
      top.map(([p, k]) => `“${visible(tr.pieces[k].text)}” ${(100 * p).toFixed(1)}%`).join(", ")),
    traceTokens(tr, { sel: q, weights: w, onPick: (j) => { hover(j); renderAttention(body, S); }, id: "attn-tokens" }));
  };
  const layer = el("input", { type: "range", id: "attn-layer", min: 0, max: tr.layers - 1, value: A.layer,
    onchange: () => { A.layer = Number(layer.value); renderAttention(body, S); } });
  const gridNode = el("div", { id: "attn-grid-wrap" });
  const open = (l, hd) => { A.layer = l; A.head = hd; renderAttention(body, S); };
  const heads = el("div", { class: "heads", id: "attn-heads" }, Array.from({ length: tr.heads }, (_, h) => el("button", {
    class: h === A.head ? "on" : "", dataset: { head: h }, onclick: () => { A.head = h; renderAttention(body, S); } }, h)));
  clear(body, live("softmax(QKᵀ/√d + causal mask) of the engine's model, in fp32"),
    el("div", { class: "controls" }, el("label", { id: "attn-layer-label" }, `layer ${A.layer + 1} of ${tr.layers}`, layer), el("span", {}, "head"), heads),
    el("p", { class: "note" }, `Each row is one token asking “which earlier tokens matter to me?”; its ${probs.length} weights sum to 1. `
      + `The upper triangle is masked: a token never sees the future. ${tr.heads} heads per layer look for different things`
      + (tr.kv_heads < tr.heads ? ` (${tr.kv_heads} key/value heads shared between them: grouped-query attention).` : ".")),
    el("div", { class: "scrollx" }, heatmap(tr, probs, hover)), looks, gridNode);
  body.querySelector("#attn-heat").dataset.layer = A.layer;
  body.querySelector("#attn-heat").dataset.head = A.head;
  hover(Math.min(A.q, probs.length - 1));
  await headGrid(gridNode, tr, A, open);
}

// The article's example: "bank" near "deposit money" vs "river". Same embedding row; different context.
export async function renderCompare(body, model) {
  clear(body, el("p", { class: "note" }, "comparing…"));
  let r;
  try {
    r = await postJSON("/trace/compare", { model });
  } catch (e) {
    clear(body, el("p", { class: "note", id: "compare-error" }, `this model cannot run the comparison: ${e.message}`));
    return;
  }
  const last = r.cos[r.cos.length - 1];
  clear(body, el("p", { id: "compare", dataset: { first: r.cos[0], last } },
    el("b", {}, `“${r.word}” in two sentences: `), `cosine of its two hidden vectors is ${r.cos[0].toFixed(3)} at the embedding `
      + `(the same row), ${last.toFixed(3)} after the last layer: attention has mixed in “deposit money” in one and “river” in the other.`),
  lineChart(r.cos.map((y, l) => [l, y]), { label: "layer", yMin: Math.max(0, Math.min(...r.cos) - 0.05), yMax: 1, h: 100 }),
  r.looks.map((lk) => el("div", {}, el("p", { class: "note" }, `last layer, mean over heads: where “${r.word}” looks`),
    traceTokens({ pieces: lk.pieces, num_prompt: lk.pieces.length }, { sel: lk.at, weights: lk.probs }))));
}
