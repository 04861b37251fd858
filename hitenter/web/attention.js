// Inside the model, panel 15: attention probabilities per layer and head (softmax(QKᵀ/√d + causal mask)),
// a heatmap with a layer slider and head picker; hover a token to see where it looks. Plus the
// "bank" comparison from the article: the same word in two sentences, pulled apart layer by layer.
import { el, clear, visible, live, seqColour, sequencer } from "./util.js";
import { postJSON } from "./api.js";
import { traceTokens, lineChart } from "./inside.js";

const attnSeq = sequencer();

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
  const A = S.attn && S.attn.trace_id === tr.trace_id ? S.attn : (S.attn = { trace_id: tr.trace_id, layer: 0, head: 0, q: tr.pieces.length - 1, cache: {} });
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
    traceTokens(tr, { sel: q, weights: w, onPick: hover, id: "attn-tokens" }));
  };
  const layer = el("input", { type: "range", id: "attn-layer", min: 0, max: tr.layers - 1, value: A.layer,
    onchange: () => { A.layer = Number(layer.value); renderAttention(body, S); } });
  const heads = el("div", { class: "heads", id: "attn-heads" }, Array.from({ length: tr.heads }, (_, h) => el("button", {
    class: h === A.head ? "on" : "", dataset: { head: h }, onclick: () => { A.head = h; renderAttention(body, S); } }, h)));
  clear(body, live("softmax(QKᵀ/√d + causal mask) of the engine's model, in fp32"),
    el("div", { class: "controls" }, el("label", { id: "attn-layer-label" }, `layer ${A.layer + 1} of ${tr.layers}`, layer), el("span", {}, "head"), heads),
    el("p", { class: "note" }, `Each row is one token asking “which earlier tokens matter to me?”; its ${probs.length} weights sum to 1. `
      + `The upper triangle is masked: a token never sees the future. ${tr.heads} heads per layer look for different things`
      + (tr.kv_heads < tr.heads ? ` (${tr.kv_heads} key/value heads shared between them: grouped-query attention).` : ".")),
    el("div", { class: "scrollx" }, heatmap(tr, probs, hover)), looks);
  body.querySelector("#attn-heat").dataset.layer = A.layer;
  body.querySelector("#attn-heat").dataset.head = A.head;
  hover(Math.min(A.q, probs.length - 1));
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
