// Inside the model, panel 15: attention probabilities per layer and head (softmax(QKᵀ/√d + causal mask)),
// a heatmap with a layer slider and head picker; hover a token to see where it looks. Plus the
// "bank" comparison from the article: the same word in two sentences, pulled apart layer by layer.
import { el, clear, visible, live, seqColour, sequencer } from "./util.js";
import { postJSON } from "./api.js";
import { traceTokens, lineChart } from "./inside.js";

const attnSeq = sequencer();
// What a head does (the server measures it on the trace: playground_heads.head_kinds), its letter and colour class.
const KIND = { "previous-token": { letter: "P", cls: "prev" }, "first-token sink": { letter: "S", cls: "sink" },
  self: { letter: "=", cls: "self" }, content: { letter: "C", cls: "content" } };
const shareText = (sh) => `on average ${(100 * sh[0]).toFixed(0)}% on the token before, ${(100 * sh[1]).toFixed(0)}% on the first token, `
  + `${(100 * sh[2]).toFixed(0)}% on itself, ${(100 * sh[3]).toFixed(0)}% on earlier content`;
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
  best ? el("button", { id: "attn-jump", dataset: { layer: best.layer, head: best.head, k: best.k, kind: best.kind },
    onclick: () => open(best.layer, best.head) }, `jump to its strongest ${best.kind} head (layer ${best.layer + 1}, head ${best.head}: `
      + `${(100 * best.p).toFixed(0)}% on “${visible(tr.pieces[best.k].text)}”)`) : null),
  el("div", { class: "hgrid", id: "attn-grid", dataset: { q, layers: h.probs.length, heads: h.probs[0].length },
    style: { gridTemplateColumns: `repeat(${h.probs[0].length}, 12px)` } }, cells));
}

// Where the user's own text sits among the traced tokens: [first, last] token index, or null (matched on the
// tokens' exact bytes, the last occurrence, so a chat template around it is found).
export function userSpan(tr, text) {
  const want = new TextEncoder().encode(text || "");
  if (!want.length) return null;
  const bytes = [], starts = [];
  tr.pieces.slice(0, tr.num_prompt).forEach((p) => { starts.push(bytes.length); bytes.push(...(p.hex.match(/../g) || []).map((h) => parseInt(h, 16))); });
  for (let at = bytes.length - want.length; at >= 0; at--) {
    let ok = true;
    for (let j = 0; j < want.length && ok; j++) ok = bytes[at + j] === want[j];
    if (!ok) continue;
    const tokenOf = (b) => { let i = 0; while (i + 1 < starts.length && starts[i + 1] <= b) i++; return i; };
    return [tokenOf(at), tokenOf(at + want.length - 1)];
  }
  return null;
}

// The heatmap of one head: rows are queries, columns keys. With `from` > 0 the template tokens before the user's
// text are folded into one column holding their total weight (so every row still sums to 1).
function heatmap(tr, probs, onHover, from = 0, span = null) {
  const t = probs.length;
  const idx = [...Array(t).keys()].filter((i) => i >= from);
  const lab = (p) => (p.special ? p.text : visible(p.text)).slice(0, 10);
  const mine = (i) => span && i >= span[0] && i <= span[1] ? "user" : "";
  const grid = el("div", { class: "heat", id: "attn-heat", dataset: { from },
    style: { gridTemplateColumns: `7em ${from ? "minmax(18px, 30px) " : ""}repeat(${idx.length}, minmax(6px, 26px))` } });
  grid.append(el("div", {}));
  if (from) grid.append(el("div", { class: "klab tmpl", title: `${from} template tokens before your text, folded` }, `⟨${from} tmpl⟩`));
  idx.forEach((k) => grid.append(el("div", { class: `klab ${mine(k)}`, title: tr.pieces[k].text }, lab(tr.pieces[k]))));
  idx.forEach((q) => {
    const row = probs[q];
    grid.append(el("div", { class: `qlab ${mine(q)}`, dataset: { q }, onmouseenter: () => onHover(q) }, lab(tr.pieces[q])));
    if (from) {
      const w = row.slice(0, from).reduce((a, b) => a + b, 0);
      grid.append(el("div", { class: "cell tmpl", dataset: { q, k: "template", p: w }, title: `${visible(tr.pieces[q].text)} → the template: ${(100 * w).toFixed(1)}%`,
        style: { background: seqColour(w) }, onmouseenter: () => onHover(q) }));
    }
    idx.forEach((k) => grid.append(el("div", { class: `cell ${k > q ? "masked" : ""}`, dataset: { q, k, p: row[k] },
      title: `${visible(tr.pieces[q].text)} → ${visible(tr.pieces[k].text)}: ${(100 * row[k]).toFixed(1)}%`,
      style: { background: k > q ? "" : seqColour(row[k]) }, onmouseenter: () => onHover(q, k) })));
  });
  return grid;
}

// One query in one head, from /trace/head: q·k/√d of its strongest keys, their softmax and their share of the value mix.
const headSeq = sequencer();
async function headDetail(node, tr, A, q, k = null) {
  const h = await headSeq(() => postJSON("/trace/head", { trace_id: tr.trace_id, layer: A.layer, head: A.head, index: q }));
  if (!h) return;
  const keys = h.probs.map((p, j) => [p, j]).sort((a, b) => b[0] - a[0]).slice(0, 5).map(([, j]) => j);
  if (k !== null && k <= q && !keys.includes(k)) keys.push(k);
  clear(node, el("table", { id: "attn-qk", dataset: { q, layer: A.layer, head: A.head, scale: h.scale } },
    el("tr", {}, el("th", {}, "key"), el("th", {}, "q·k/√d"), el("th", {}, "softmax"), el("th", {}, "share of the value mix")),
    keys.map((j) => el("tr", { class: j === k ? "chosen" : "", dataset: { k: j, score: h.scores[j], p: h.probs[j], share: h.value_share[j] } },
      el("td", {}, el("code", {}, visible(tr.pieces[j].text))), el("td", { class: "num" }, h.scores[j] === null ? "masked" : h.scores[j].toFixed(2)),
      el("td", { class: "num" }, `${(100 * h.probs[j]).toFixed(1)}%`), el("td", { class: "num" }, `${(100 * h.value_share[j]).toFixed(1)}%`)))),
  el("p", { class: "note" }, `score = q·k × ${h.scale.toFixed(4)} (1/√d); softmax over the ${q + 1} keys gives the weights; `
    + `the head's output is Σ p_k v_k (length ${h.out_norm.toFixed(2)}): a key's share is |p_k v_k| over the sum.`
    + (h.kv_head !== A.head ? ` This head reads key/value head ${h.kv_head} (shared by a group of heads).` : "")));
}

export async function renderAttention(body, S) {
  const tr = S.trace;
  if (!tr) { clear(body, live("attention probabilities of a traced forward"), el("p", { class: "note" }, "Press Enter to trace the prompt.")); return; }
  let A = S.attn && S.attn.trace_id === tr.trace_id ? S.attn : null;
  if (!A) {                // a new trace opens where your last token looks hardest (not layer 1, head 0)
    const own = userSpan(tr, S.tracedText);       // the query: your last token ("bank"), not the template's
    A = S.attn = { trace_id: tr.trace_id, layer: 0, head: 0, q: own ? own[1] : tr.num_prompt - 1, cache: {} };
    const h = await gridSeq(() => postJSON("/trace/heads", { trace_id: tr.trace_id, index: A.q })).catch(() => null);
    if (h && h.strongest) Object.assign(A, { layer: h.strongest.layer, head: h.strongest.head, heads: h });
  }
  const data = A.cache[A.layer] || await attnSeq(() => postJSON("/trace/attention", { trace_id: tr.trace_id, layer: A.layer }));
  if (!data) return;
  A.cache[A.layer] = data;
  const probs = data.probs[A.head];
  const looks = el("div", { id: "attn-looks" });
  const detail = el("div", { id: "attn-detail" });
  const span = userSpan(tr, S.tracedText);
  if (A.fold === undefined) A.fold = Boolean(span && span[0] > 0);
  const from = A.fold && span ? span[0] : 0;
  const hover = (q, k = null) => {
    if (q < from) q = probs.length - 1;
    clearTimeout(A.timer);                   // a mouse crossing the grid asks once it rests
    A.timer = setTimeout(() => headDetail(detail, tr, A, q, k).catch((e) => console.warn(e)), 120);
    if (A.q === q && looks.firstChild) return;
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
  const kinds = A.heads && A.heads.kinds ? A.heads.kinds[A.layer] : null;
  const shares = A.heads && A.heads.shares ? A.heads.shares[A.layer] : null;
  const heads = el("div", { class: "heads", id: "attn-heads" }, Array.from({ length: tr.heads }, (_, h) => el("button", {
    class: `${h === A.head ? "on" : ""} kind-${kinds ? KIND[kinds[h]].cls : ""}`, dataset: { head: h, kind: kinds ? kinds[h] : "" },
    title: kinds ? `head ${h}: ${kinds[h]} head${shares ? ` (${shareText(shares[h])})` : ""}` : `head ${h}`,
    onclick: () => { A.head = h; renderAttention(body, S); } }, h, kinds ? el("small", {}, KIND[kinds[h]].letter) : null)));
  const kindNote = kinds ? el("p", { class: "note", id: "attn-kind", dataset: { kind: kinds[A.head], layer: A.layer, head: A.head } },
    el("b", {}, `head ${A.head} of layer ${A.layer + 1} is a ${kinds[A.head]} head`), shares ? ` (${shareText(shares[A.head])})` : "",
    `. Heads are labelled by what they do, measured on this trace's ${A.heads.queries} queries: `,
    Object.entries(KIND).map(([k, v]) => `${v.letter} ${k}`).join(" · "),
    ". A content head is where one token gathers meaning from another; previous-token and sink heads are plumbing.") : null;
  clear(body, live("softmax(QKᵀ/√d + causal mask) of the engine's model, in fp32"),
    el("div", { class: "controls" }, el("label", { id: "attn-layer-label" }, `layer ${A.layer + 1} of ${tr.layers}`, layer), el("span", {}, "head"), heads),
    kindNote,
    el("p", { class: "note" }, `Each row is one token asking “which earlier tokens matter to me?”; its ${probs.length} weights sum to 1. `
      + `The upper triangle is masked: a token never sees the future. ${tr.heads} heads per layer look for different things`
      + (tr.kv_heads < tr.heads ? ` (${tr.kv_heads} key/value heads shared between them: grouped-query attention).` : ".")),
    span && span[0] > 0 ? el("label", { class: "note" }, el("input", { type: "checkbox", id: "attn-fold", checked: A.fold,
      onchange: (e) => { A.fold = e.target.checked; renderAttention(body, S); } }),
    ` fold the ${span[0]} chat-template tokens before your text into one column (your tokens are boxed)`) : null,
    el("div", { class: "scrollx" }, heatmap(tr, probs, hover, from, span)), looks, detail, gridNode);
  body.querySelector("#attn-heat").dataset.layer = A.layer;
  body.querySelector("#attn-heat").dataset.head = A.head;
  hover(Math.min(A.q, probs.length - 1));
  await headGrid(gridNode, tr, A, open);
}

// The article's example: the same word after two different clues ("deposited my money at the bank", "we sat on
// the river bank"). The clue comes before the word: a causal model reads only what came before it.
export const BANK_PAIR = ["I deposited my money at the bank", "we sat on the river bank"];

// The earlier tokens a word looked at most (not the first token, which soaks up spare attention, nor itself).
export function topLooks(lk, n = 2) {
  return lk.probs.map((p, k) => [p, k]).filter(([, k]) => k > 0 && k < lk.at).sort((x, y) => y[0] - x[0]).slice(0, n)
    .map(([p, k]) => ({ k, p, text: lk.pieces[k].text.trim() }));
}

export async function renderCompare(body, model, a = BANK_PAIR[0], b = BANK_PAIR[1], word = "bank") {
  clear(body, el("p", { class: "note" }, "comparing…"));
  let r;
  try {
    r = await postJSON("/trace/compare", { model, a, b, word });
  } catch (e) {
    clear(body, el("p", { class: "note", id: "compare-error" }, `this model cannot run the comparison: ${e.message.replace(/^[^{]*\{"detail":"?|"?\}$/g, "")}`));
    return;
  }
  const last = r.cos[r.cos.length - 1];
  const looks = r.looks.map((lk) => topLooks(lk));
  const said = (l) => l.map((x) => `“${x.text}” ${(100 * x.p).toFixed(0)}%`).join(", ");
  clear(body, el("p", { id: "compare", dataset: { first: r.cos[0], last, looksA: JSON.stringify(looks[0].map((x) => x.k)),
    looksB: JSON.stringify(looks[1].map((x) => x.k)) } },
  el("b", {}, `“${r.word}” after two different clues: `), `cosine of its two hidden vectors is ${r.cos[0].toFixed(3)} at the embedding `
      + `(the same row), ${last.toFixed(3)} after the last layer. The clue comes before the word, because a causal model reads only `
      + `what came before it. In the last layer (mean over heads) “${r.word}” looked most at ${said(looks[0])} in the first sentence `
      + `and ${said(looks[1])} in the second.`),
  lineChart(r.cos.map((y, l) => [l, y]), { label: "layer", yMin: Math.max(0, Math.min(...r.cos) - 0.05), yMax: 1, h: 100 }),
  r.looks.map((lk) => el("div", {}, el("p", { class: "note" }, `last layer, mean over heads: where “${r.word}” looks`),
    traceTokens({ pieces: lk.pieces, num_prompt: lk.pieces.length }, { sel: lk.at, weights: lk.probs }))));
}
