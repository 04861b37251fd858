// Panel 10, second half: why temperature 0 changes with the batch on other servers. The answer's own steps,
// each row's logits alone and among N other rows, in this server's arithmetic (row-padded, batch invariant)
// and in a plain dense fp32 GEMM (POST /determinism/arithmetic): bits that differ, the largest difference,
// the top-two margin, and whether the greedy token flips. A flip needs a margin below the difference.
import { el, clear, visible } from "./util.js";

const sci = (x) => (x === 0 ? "0" : x.toExponential(1));

export function renderArithmetic(node, r, pieceOf) {
  const real = r.steps.filter((s) => !s.near_tie), tie = r.steps.find((s) => s.near_tie);
  const flips = (k) => real.filter((s) => s[k].flip).length;
  const differ = (k) => real.filter((s) => s[k].bits_differ > 0).length;
  const closest = real.reduce((a, s) => (!a || s.plain.margin < a.plain.margin ? s : a), null);
  const row = (s) => el("tr", { class: s.plain.flip || s.engine.flip ? "chosen" : "", dataset: { step: s.step, nearTie: s.near_tie,
    engineBits: s.engine.bits_differ, plainBits: s.plain.bits_differ, plainFlip: s.plain.flip, engineFlip: s.engine.flip, margin: s.plain.margin } },
  el("td", {}, s.near_tie ? "near tie (built)" : `step ${s.step}`),
  el("td", {}, el("code", {}, s.near_tie ? "–" : visible(pieceOf(r.answer[s.step])))),
  el("td", { class: "num" }, s.engine.bits_differ), el("td", {}, s.engine.flip ? "flips" : "same"),
  el("td", { class: "num" }, s.plain.bits_differ), el("td", { class: "num" }, sci(s.plain.max_diff)),
  el("td", { class: "num" }, sci(s.plain.margin)), el("td", { class: s.plain.flip ? "err" : "" }, s.plain.flip
    ? `flips: ${visible(pieceOf(s.plain.top_alone))} → ${visible(pieceOf(s.plain.top_batched))}` : "same"));
  clear(node, el("p", { id: "det-arith", dataset: { engineDiffer: differ("engine"), plainDiffer: differ("plain"),
    plainFlips: flips("plain"), engineFlips: flips("engine"), tieFlip: tie ? tie.plain.flip : "", steps: real.length, windowStart: r.window_start } },
  el("b", {}, "the same rows, two arithmetics: "), `each of the answer's ${real.length} steps turned into logits alone and among `
    + `${r.others} other rows. This server (row-padded, batch invariant): ${differ("engine")} of ${real.length} steps differ in any bit. `
    + `A plain dense fp32 GEMM, as a server without batch invariance computes it: ${differ("plain")} of ${real.length} steps differ `
    + `in some bits, ${flips("plain")} greedy flip(s)`
    + (closest ? `; the closest call is step ${closest.step}, top-two margin ${sci(closest.plain.margin)} against a difference of `
      + `${sci(closest.plain.max_diff)}. A flip needs the margin below the difference` : "")
    + (tie ? `. The last row is built to be a near tie (its two top tokens' logits equal to within rounding): there the plain arithmetic `
      + `${tie.plain.flip ? "flips the greedy token: the batch decided it" : "did not flip in this try"}, this server's does not.` : ".")),
  r.window_start ? el("p", { class: "note" }, `(a long prompt: traced from token ${r.window_start} on)`) : null,
  el("div", { class: "scrollx" }, el("table", { id: "det-arith-table" },
    el("tr", {}, el("th", {}, ""), el("th", {}, "token"), el("th", {}, "this server: bits differ"), el("th", {}, "greedy"),
      el("th", {}, "plain: bits differ"), el("th", {}, "largest Δ"), el("th", {}, "top-two margin"), el("th", {}, "greedy")),
    r.steps.map(row))));
}
