// Panels 2 and 3: the next-token distribution through the sampler chain, and the dice roll.
import { el, clear, visible, pct, live } from "./util.js";
import { postJSON } from "./api.js";

const SHOW = 15;   // candidate rows drawn (the engine traces the top 50)
const STAGES = ["raw", "temperature", "top_k", "top_p", "min_p"];

// Draw the stages of one step: `d` = {candidates: [piece], stages: [{name, probs, kept, num_kept}], entropy?}
// Temperature 0 (greedy): the sampler takes the argmax and rolls no dice, so the distribution it samples from
// is one-hot on the engine's top candidate (candidates come sorted by raw logit): drawn as that, not the raw spread.
function oneHot(d) {
  const top = d.stages[0].probs.indexOf(Math.max(...d.stages[0].probs));
  const probs = d.stages[0].probs.map((_, i) => (i === top ? 1 : 0));
  return { name: "greedy", probs, kept: probs.map((x) => x > 0), num_kept: 1 };
}

// The same candidates as the table on screen: its rows kept and their numbers and bars changed in place, so
// the bars slide to their new lengths (CSS transition) as a slider moves, instead of being redrawn.
function morph(old, fresh) {
  Object.assign(old.dataset, fresh.dataset);
  [...fresh.rows].forEach((row, i) => {
    const o = old.rows[i];
    o.className = row.className;
    Object.assign(o.dataset, row.dataset);
    [...row.cells].forEach((c, j) => {
      const oc = o.cells[j], bar = c.querySelector(".bar div, div");
      if (c.classList.contains("bar") && bar) oc.firstChild.style.width = bar.style.width;
      else if (!c.querySelector("code")) oc.textContent = c.textContent;
    });
  });
  return old;
}

export function renderDistribution(body, d, { chosen = null, reshaped = false, entropy = null, label = "", params = null,
  step = null, greedy = false, context = "" } = {}) {
  const stages = d.stages.filter((s) => STAGES.includes(s.name));
  const last = greedy ? oneHot(d) : d.stages[d.stages.length - 1];
  if (greedy) stages.push(last);
  const head = el("tr", {}, el("th", {}, "token"), stages.map((s) => el("th", {}, s.name === "raw" ? "raw p"
    : s.name === "greedy" ? "greedy (T = 0)" : `after ${s.name}`)), el("th", {}, "final"));
  const rows = d.candidates.slice(0, SHOW).map((p, i) => {
    const kept = last.kept[i];
    return el("tr", { class: `${kept ? "" : "cut"} ${p.id === chosen ? "chosen" : ""}`,
      dataset: { id: p.id, kept, raw: d.stages[0].probs[i], final: last.probs[i] } },
    el("td", {}, el("code", {}, p.special ? p.text : visible(p.text))),
    stages.map((s) => el("td", {}, s.kept[i] ? pct(s.probs[i]) : "cut")),
    el("td", { class: "bar" }, el("div", { style: { width: `${(100 * last.probs[i]).toFixed(1)}%` } })));
  });
  const ent0 = entropy || d.entropy;
  const ent = ent0 && greedy ? [...ent0, 0] : ent0;      // one-hot: no uncertainty left
  const ids = JSON.stringify(d.candidates.slice(0, SHOW).map((p) => p.id));
  let table = el("table", { id: "dist-table", dataset: { reshaped, kept: last.num_kept, step: step ?? "", greedy,
    temperature: params ? params.temperature : "", topK: params ? params.top_k : "", topP: params ? params.top_p : "", ids,
    columns: stages.length } }, head, rows);
  const old = body.querySelector("#dist-table");
  if (old && old.dataset.ids === ids && old.dataset.columns === String(stages.length)) table = morph(old, table);
  clear(body,
    live(reshaped ? "reshape_distribution() on the step's cached logits (no model run)" : "the sampler's trace of this step"),
    label ? el("p", { class: "note" }, label) : null,
    context ? el("p", { class: "context", id: "dist-context" }, el("span", { class: "note" }, "after "), el("code", {}, context),
      el("span", { class: "note" }, " the next token is one of:")) : null,
    table,
    el("p", { class: "note" }, greedy ? "temperature 0: one-hot. The top token gets probability 1, every other 0; no dice are rolled."
      : `${last.num_kept} tokens of the vocabulary still possible after the chain; greyed rows were cut.`),
    ent ? el("p", { id: "entropy", dataset: { raw: ent[0], final: ent[ent.length - 1] } },
      `entropy: ${ent[0].toFixed(2)} bits raw → ${ent[ent.length - 1].toFixed(2)} bits after the chain`) : null);
}

// Sliders that re-shape the selected step's cached logits at once (and set the next request's params).
export function renderSliders(container, params, onChange) {
  const spec = [["temperature", 0, 2, 0.05], ["top_k", -1, 50, 1], ["top_p", 0.05, 1, 0.05], ["min_p", 0, 1, 0.01]];
  const out = {};
  clear(container, spec.map(([name, min, max, step]) => {
    const val = el("span", {}, String(params[name]));
    const input = el("input", { type: "range", id: `slider-${name}`, min, max, step, value: params[name],
      oninput: () => { params[name] = Number(input.value); val.textContent = input.value; onChange(); } });
    out[name] = input;
    return [el("label", { for: `slider-${name}` }, name), input, val];
  }));
  return out;
}

export async function reshape(model, step, params) {
  return postJSON("/reshape", { model, request_id: step.rid, index: step.index, params });
}

let lastDraw = null;

// Panel 3: the seed, the exponential race the sampler really runs, and the chosen slice of the CDF.
export function renderDice(body, step, index = null) {
  const t = step && step.trace;
  if (!t) { clear(body, live("the sampler's DrawTrace"), el("p", { class: "note" }, "Press Enter to roll.")); return; }
  const draw = t.draw;
  const last = t.stages[t.stages.length - 1];
  const cands = t.pieces.map((p, i) => ({ p, prob: last.probs[i], q: draw.q ? draw.q[i] : null })).filter((c) => c.prob > 0);
  const win = cands.findIndex((c) => c.p.id === draw.token_id);
  // the strip: every slice (the winner's too, however thin) and a pointer where the draw landed
  const segs = cands.slice(0, Math.max(30, win + 1)).map((c) => el("div", {
    class: c.p.id === draw.token_id ? "chosen" : "", title: `${visible(c.p.text)} ${pct(c.prob)}`,
    style: { width: `${(100 * c.prob).toFixed(2)}%`, minWidth: c.p.id === draw.token_id ? "3px" : "",
      background: c.p.id === draw.token_id ? "#f3b0a8" : "#c8d6f2" } },
  visible(c.p.text)));
  const at = win < 0 ? null : cands.slice(0, win).reduce((a, c) => a + c.prob, 0) + cands[win].prob / 2;
  const pointer = at === null ? null : el("div", { class: "pointer", id: "dice-pointer", dataset: { token: draw.token_id, at },
    style: { left: "0%" } }, "▼");
  // slices have borders and the winner a minimum width: put the pointer over the drawn slice as laid out
  // a new draw: the pointer slides from the left edge onto its slice; the same draw redrawn: it stays put
  const key = `${step.rid}/${step.index}/${draw.token_id}`;
  const fresh = key !== lastDraw;
  lastDraw = key;
  requestAnimationFrame(() => {
    const seg = body.querySelector(".cdf > div.chosen");
    if (!pointer) return;
    if (!fresh) pointer.style.transition = "none";
    void pointer.offsetWidth;                 // lay out the start position first, so the move is animated
    pointer.style.left = seg ? `${seg.offsetLeft + seg.offsetWidth / 2}px` : `${(100 * at).toFixed(2)}%`;
  });
  const head = el("p", { id: "dice", dataset: { method: draw.method, seed: draw.seed ?? "", token: draw.token_id } },
    draw.method === "greedy" ? "temperature 0: greedy, the argmax is taken and no dice are rolled."
      : `seed ${draw.seed}: each candidate i gets q_i ~ Exp(1) from the request's own generator; `
        + "the token with the largest p_i / q_i wins, which picks token i with probability exactly p_i.");
  const race = draw.q ? el("table", {}, el("tr", {}, el("th", {}, "token"), el("th", {}, "p"), el("th", {}, "q ~ Exp(1)"), el("th", {}, "p / q")),
    // the top 8 by p, and the winner always (with its rank) when it is further down
    cands.map((c, r) => [c, r]).filter(([, r]) => r < 8 || r === win).map(([c, r]) => el("tr", {
      class: c.p.id === draw.token_id ? "chosen" : "", dataset: { id: c.p.id, rank: r } },
    el("td", {}, r >= 8 ? `#${r + 1} ` : "", el("code", {}, visible(c.p.text))), el("td", {}, pct(c.prob)),
    el("td", {}, c.q.toPrecision(3)), el("td", {}, (c.prob / c.q).toPrecision(4))))) : null;
  const chosen = cands.find((c) => c.p.id === draw.token_id);
  clear(body, live("the sampler's DrawTrace (seed, q, chosen token)"),
    index === null ? null : el("p", { class: "note", id: "dice-step", dataset: { step: index } }, `step ${index}`), head,
    el("div", { class: "cdfwrap" }, pointer, el("div", { class: "cdf", title: "the final distribution laid end to end (cumulative)" }, segs)),
    el("p", { class: "note", id: "dice-winner", dataset: { token: draw.token_id, rank: win } }, !chosen
      ? "the chosen token is outside the traced candidates" : `chosen${win >= 8 ? ` (rank ${win + 1}, listed below the top 8)` : ""}: "${visible(chosen.p.text)}" with p = ${pct(chosen.prob)}`
      + (draw.chosen_u !== null && draw.chosen_u !== undefined ? ` · its draw q = ${draw.chosen_q.toPrecision(3)} (uniform 1 − e^−q = ${draw.chosen_u.toPrecision(3)})` : "")),
    race);
}
