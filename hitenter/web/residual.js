// Inside the model, panels 16-17: the residual stream through the layers (its size, and the logit lens:
// what the model would say if we stopped at layer L) and the logits: raw scores, softmax, probabilities.
import { el, clear, visible, pct, live, tokenChip, sequencer } from "./util.js";
import { postJSON } from "./api.js";
import { traceTokens } from "./inside.js";
import { renderFfn } from "./ffn.js";

const lensSeq = sequencer();
const partsSeq = sequencer();

// What each layer added to one token's stream: attention's part beside the MLP's (their lengths, from /trace/parts).
async function parts(node, tr, i) {
  const r = await partsSeq(() => postJSON("/trace/parts", { trace_id: tr.trace_id, index: i }));
  if (!r) return;
  const max = Math.max(...r.layers.flatMap((l) => [l.attention, l.mlp]), 1e-9);
  clear(node, el("p", {}, el("b", {}, "what each layer added: "), el("span", { class: "swatch attn" }), " attention ",
    el("span", { class: "swatch mlp" }), " MLP (the length of each one's addition to the stream at this token)"),
  el("div", { class: "partbars", id: "resid-parts", dataset: { index: i, attention: JSON.stringify(r.layers.map((l) => l.attention)),
    mlp: JSON.stringify(r.layers.map((l) => l.mlp)) } },
  r.layers.map((l) => el("div", { class: "pair", title: `layer ${l.layer + 1}: attention ${l.attention.toFixed(2)}, MLP ${l.mlp.toFixed(2)}` },
    el("i", { class: "attn", style: { height: `${(100 * l.attention) / max}%` } }), el("i", { class: "mlp", style: { height: `${(100 * l.mlp) / max}%` } })))));
}
const logitSeq = sequencer();

export async function renderResidual(body, S, index = null) {
  const tr = S.trace;
  if (!tr) { clear(body, live("hidden states of a traced forward"), el("p", { class: "note" }, "Press Enter to trace the prompt.")); return; }
  const i = index ?? S.lensSel ?? tr.pieces.length - 1;
  S.lensSel = i;
  const r = await lensSeq(() => postJSON("/trace/lens", { trace_id: tr.trace_id, index: i }));
  if (!r) return;
  const max = Math.max(...r.norms);
  const partsNode = el("div", { id: "resid-parts-wrap" });
  const ffnNode = el("div", { id: "ffn-wrap" });
  const bars = el("div", { class: "normbars", id: "resid-norms", dataset: { norms: JSON.stringify(r.norms) } },
    r.norms.map((n, l) => el("div", { title: `${l === 0 ? "embedding" : `after layer ${l}`}: |x| = ${n.toFixed(2)}`,
      style: { height: `${(100 * n) / max}%` } })));
  const rows = r.top.map((top, l) => el("tr", { dataset: { layer: l, top: top[0].piece.id } },
    el("td", {}, l === 0 ? "embedding" : `layer ${l}`),
    top.slice(0, 3).map((t) => el("td", { style: { background: `rgba(47,111,222,${(0.45 * t.p).toFixed(3)})` } }, el("code", {}, t.piece.special ? t.piece.text : visible(t.piece.text)), " ", pct(t.p)))));
  clear(body, live("the residual stream x after each layer; the lens is the model's own final norm + LM head"),
    el("p", { class: "note" }, "Each layer reads the stream, computes something (attention, then an MLP) and adds it back: "
      + "x ← x + attention(x), x ← x + mlp(x). Click a token to follow it."),
    traceTokens(tr, { sel: i, onPick: (j) => renderResidual(body, S, j) }),
    el("p", {}, el("b", {}, `size of the stream at “${visible(tr.pieces[i].text)}”`), " (L2 norm), embedding → last layer:"),
    bars,
    el("p", {}, el("b", {}, "logit lens: "), "if we stopped after layer L and read the stream out as a prediction:"),
    el("div", { class: "scrollx lens" }, el("table", { id: "lens", dataset: { index: i } },
      el("tr", {}, el("th", {}, "stop at"), el("th", {}, "1st"), el("th", {}, "2nd"), el("th", {}, "3rd")), rows)),
    el("p", { class: "note" }, "Early layers mostly echo the input; the answer forms in the last few."), partsNode, ffnNode);
  await parts(partsNode, tr, i);
  await renderFfn(ffnNode, tr, i, S);
}

export async function renderLogits(body, S, temperature = null) {
  const tr = S.trace;
  if (!tr) { clear(body, live("logits of a traced forward"), el("p", { class: "note" }, "Press Enter to trace the prompt.")); return; }
  const t = temperature ?? S.logitT ?? 1;
  S.logitT = t;
  const last = tr.pieces.length - 1;
  const r = await logitSeq(() => postJSON("/trace/logits", { trace_id: tr.trace_id, index: last, temperature: t }));
  if (!r) return;
  const lo = Math.min(...r.rows.map((x) => x.logit), 0), hi = Math.max(...r.rows.map((x) => x.logit));
  const bar = (v, cls) => el("div", { class: `hbar ${cls}` }, el("i", { style: { width: `${(100 * v).toFixed(1)}%` } }));
  const rows = r.rows.map((x) => el("tr", { dataset: { id: x.piece.id, logit: x.logit, p: x.p_t } },
    el("td", {}, tokenChip(x.piece)),
    el("td", { class: "num" }, x.logit.toFixed(2)), el("td", {}, bar((x.logit - lo) / Math.max(1e-9, hi - lo), "raw")),
    el("td", { class: "arrow" }, "→"),
    el("td", { class: "num" }, pct(x.p_t)), el("td", {}, bar(x.p_t, "prob"))));
  const slider = el("input", { type: "range", id: "logit-temp", min: 0.05, max: 2, step: 0.05, value: t,
    oninput: () => { readout.textContent = slider.value; renderLogits(body, S, Number(slider.value)); } });
  const readout = el("span", { id: "logit-temp-value" }, String(t));
  clear(body, live("the LM head's output row (fp32) for the last position"),
    el("p", { class: "note" }, `The last layer's vector, normed, is multiplied by the ${tr.vocab}-row head: one raw score (a logit) `
      + "per token. Logits are any real number; softmax turns them into probabilities: p_i = exp(z_i / T) / Σ_j exp(z_j / T)."),
    el("div", { class: "controls" }, el("label", { for: "logit-temp" }, "temperature T"), slider, readout),
    last === tr.num_prompt - 1 ? el("p", { class: "note", id: "logits-step", dataset: { step: 0 } }, "step 0: the scores for the first "
      + "token after your prompt, the same step the temperature, top-k, top-p and draw steps show.") : null,
    el("div", { class: "scrollx" }, el("table", { id: "logits", dataset: { temperature: r.temperature, lse: r.logsumexp, index: last } },
      el("tr", {}, el("th", {}, "token"), el("th", {}, "logit z"), el("th", {}, ""), el("th", {}, "softmax"),
        el("th", {}, `p at T=${t}`), el("th", {}, "")), rows)),
    el("p", { class: "note" }, `log Σ exp(z) = ${r.logsumexp.toFixed(2)}: subtract it from a logit and you have its log-probability at T = 1. `
      + "Lower T sharpens the distribution, higher T flattens it; the order never changes."));
}
