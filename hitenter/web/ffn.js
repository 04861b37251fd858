// Inside one layer, after attention (panel 16): the norm in front of the feed-forward block (the stream's size
// before and after RMSNorm) and the block's hidden neurons for one token (which fire, how strongly), from
// POST /trace/ffn on the engine's own layer modules. A layer slider picks the layer.
import { el, clear, live, divColour, sequencer, visible } from "./util.js";
import { postJSON } from "./api.js";

const ffnSeq = sequencer();
const f2 = (x) => x.toFixed(2);

function strip(values, id) {
  const m = Math.max(...values.map(Math.abs), 1e-9);
  return el("div", { class: "vstrip", id }, values.map((v) => el("i", { style: { background: divColour(v / m) }, title: v.toFixed(3) })));
}

export async function renderFfn(node, tr, index, S) {
  const layer = Math.min(S.ffnLayer ?? Math.floor(tr.layers / 2), tr.layers - 1);
  S.ffnLayer = layer;
  let r;
  try {
    r = await ffnSeq(() => postJSON("/trace/ffn", { trace_id: tr.trace_id, index, layer }));
  } catch (e) {
    clear(node, el("p", { class: "note", id: "ffn-error" }, `feed-forward view: ${e.message.replace(/^[^{]*\{"detail":"?|"?\}$/g, "")}`));
    return;
  }
  if (!r) return;
  const slider = el("input", { type: "range", id: "ffn-layer", min: 0, max: tr.layers - 1, value: layer,
    onchange: () => { S.ffnLayer = Number(slider.value); renderFfn(node, tr, index, S); } });
  const max = Math.max(...r.hist, 1);
  const n = r.norm;
  clear(node, el("h3", {}, "Inside one layer: the norm, then the feed-forward block"),
    live("the layer's own ffn_norm, gate_up and down on this token's stream (POST /trace/ffn)"),
    el("div", { class: "controls" }, el("label", { id: "ffn-layer-label" }, `layer ${layer + 1} of ${tr.layers}`, slider),
      el("span", { class: "note" }, `token “${visible(tr.pieces[index].text)}” (position ${index})`)),
    n ? el("div", { id: "ffn-norm", dataset: { before: n.before.rms, after: n.after.rms, kind: n.kind } },
      el("p", {}, el("b", {}, `${n.kind === "RMSNorm" ? "RMS norm" : "layer norm"}: `),
        `the stream arrives with rms ${f2(n.before.rms)} (largest value ${f2(n.before.max_abs)}); divided by its rms and times the `
        + `norm's learned weights (mean ${f2(n.weight.mean)}) it leaves with rms ${f2(n.after.rms)}. Every block reads a `
        + "normalised copy, so no layer sees numbers that grew layer after layer; the stream itself keeps its size (the bars above)."),
      el("div", { class: "note" }, "first 48 numbers, before → after (blue negative, red positive):"),
      strip(n.before_head, "ffn-before"), strip(n.after_head, "ffn-after")) : null,
    el("p", { id: "ffn-block", dataset: { dim: r.ffn_dim, fire: r.fire_share, out: r.out_norm, error: r.error } },
      el("b", {}, "feed-forward: "), `${r.ffn_dim} hidden neurons; each computes ${r.activation}(gate) × up from the normed `
        + `vector, and the down projection adds their weighted sum back to the stream (length ${f2(r.out_norm)} onto ${f2(r.mid_norm)}). `
        + `For this token ${(100 * r.fire_share).toFixed(1)}% of them fire (over 10% of the strongest); most stay near zero.`),
    el("div", { class: "hist", id: "ffn-hist", title: `activations from ${f2(r.hist_range[0])} to ${f2(r.hist_range[1])}` },
      r.hist.map((c) => el("i", { style: { height: `${c ? Math.max(3, (100 * Math.log1p(c)) / Math.log1p(max)) : 0}%` } }))),
    el("div", { class: "note" }, `activation values, ${f2(r.hist_range[0])} … ${f2(r.hist_range[1])} (log count)`),
    el("div", { class: "scrollx" }, el("table", { id: "ffn-top" }, el("tr", {}, el("th", {}, "neuron"), el("th", {}, "gate"),
      el("th", {}, r.activation), el("th", {}, "up"), el("th", {}, "activation")),
    r.top.map((t) => el("tr", { dataset: { neuron: t.neuron, a: t.a } }, el("td", {}, `#${t.neuron}`), el("td", { class: "num" }, f2(t.gate)),
      el("td", { class: "num" }, f2(t.act)), el("td", { class: "num" }, f2(t.up)), el("td", { class: "num" }, el("b", {}, f2(t.a))))))),
    el("p", { class: "note" }, `the strongest ${r.top.length} neurons for this token; x + attention + this block = the traced stream `
      + `after the layer to ${r.error.toExponential(1)}.`));
}
