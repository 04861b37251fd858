// Panels 19 and 20: the two drills of the lesson, with checked answers. Words to tokens (tokens ≈ words ÷ 0.75, then
// measured on your own text with the real tokenizer) and softmax by hand on three of the model's own logits
// (adding the same number to every logit changes nothing).
import { el, clear, visible, pct, live } from "./util.js";

const WORDS = [3000, 1200, 600, 4500, 9000, 150];
export const wordsToTokens = (w) => w / 0.75;
export const countWords = (text) => (text.trim() ? text.trim().split(/\s+/).length : 0);
// within 10% of the rule's answer
export const wordsOk = (w, answer) => Math.abs(answer - wordsToTokens(w)) <= 0.1 * wordsToTokens(w);

export function softmax(z) {
  const m = Math.max(...z);
  const e = z.map((x) => Math.exp(x - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / s);
}
// within one percentage point of the exact p of the first logit
export const softmaxOk = (z, answerPct) => Math.abs(answerPct / 100 - softmax(z)[0]) <= 0.01;

function verdict(id, ok, yes, no) {
  return el("p", { id, class: ok ? "ok" : "err", dataset: { ok } }, ok ? `✓ ${yes}` : `✗ ${no}`);
}

function wordsDrill(S, D) {
  const w = WORDS[D.wi % WORDS.length];
  const input = el("input", { type: "number", id: "drill-words-answer", min: 0, style: { width: "7em" }, value: D.wAnswer ?? "" });
  const check = () => { D.wAnswer = input.value === "" ? null : Number(input.value); D.render(); };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); check(); } });
  const a = D.wAnswer;
  const out = a === null || a === undefined ? null : verdict("drill-words-result", wordsOk(w, a),
    `about ${Math.round(wordsToTokens(w))} tokens: ${w} words ÷ 0.75.`,
    `${a} is off: ${w} words ÷ 0.75 ≈ ${Math.round(wordsToTokens(w))} tokens (a token is about ¾ of a word).`);
  const text = document.getElementById("prompt").value;
  const words = countWords(text);
  const model = document.getElementById("model").value;
  const u = S.run && S.run.userTokens && S.run.promptText === text && S.run.model === model ? S.run.userTokens : null;
  return el("div", { id: "drill-words", dataset: { words: w, want: wordsToTokens(w) } },
    el("h3", {}, "Drill 1 · words to tokens"),
    el("p", {}, `An English document has ${w.toLocaleString("en")} words. About how many tokens is it?`),
    el("p", {}, input, " ", el("button", { id: "drill-words-check", onclick: check }, "check"), " ",
      el("button", { id: "drill-words-next", onclick: () => { D.wi++; D.wAnswer = null; D.render(); } }, "another")),
    out,
    el("p", { id: "drill-words-own", dataset: { words, tokens: u ? u.tokens : "" } }, el("b", {}, "Now measure: "),
      u && words ? [`your prompt has ${words} words; the rule says ≈ ${Math.round(wordsToTokens(words))} tokens; this model's tokenizer `
        + `makes ${u.tokens} (${(u.tokens / words).toFixed(2)} tokens per word, ${(words / u.tokens).toFixed(2)} words per token). `,
      "Estimate with ¾ of a word per token; count with the real tokenizer (code, numbers and rare words cost more)."]
        : "press Enter on a prompt and its words and tokens are counted here (the text you typed, without the chat template)."));
}

function softmaxDrill(S, D) {
  const next = S.trace && S.trace.next && S.tracedModel === document.getElementById("model").value ? S.trace.next.slice(0, 3) : null;
  const z0 = next ? next.map((x) => Math.round(x.logit * 10) / 10) : [2, 1, 0.1];
  const z = z0.map((x) => x + D.shift);
  const names = next ? next.map((x) => (x.piece.special ? x.piece.text : visible(x.piece.text))) : ["a", "b", "c"];
  const p = softmax(z);
  const input = el("input", { type: "number", id: "drill-softmax-answer", step: "0.1", style: { width: "6em" },
    value: D.answer ?? "" });
  const check = () => { D.answer = input.value === "" ? null : Number(input.value); D.render(); };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); check(); } });
  const a = D.answer;
  const out = a === null || a === undefined ? null : [verdict("drill-softmax-result", softmaxOk(z, a), `p = ${pct(p[0])}.`, `${a}% is off.`),
    el("p", { class: "note" }, `e^${z[0].toFixed(1)} / (e^${z[0].toFixed(1)} + e^${z[1].toFixed(1)} + e^${z[2].toFixed(1)}) = `
      + `${Math.exp(z[0]).toPrecision(4)} / ${z.reduce((s, x) => s + Math.exp(x), 0).toPrecision(4)} = ${pct(p[0])}. Only the differences matter: `
      + `e^(${(z[1] - z[0]).toFixed(1)}) = ${Math.exp(z[1] - z[0]).toFixed(3)} and e^(${(z[2] - z[0]).toFixed(1)}) = ${Math.exp(z[2] - z[0]).toFixed(3)} against 1.`)];
  return el("div", { id: "drill-softmax", dataset: { z: JSON.stringify(z), p: JSON.stringify(p), shift: D.shift } },
    el("h3", {}, "Drill 2 · softmax by hand"),
    el("p", {}, next ? "The model's three highest logits for the token after your prompt (rounded):" : "Three logits (press Enter for the model's own):"),
    el("table", { id: "drill-softmax-table" }, el("tr", {}, el("th", {}, "token"), el("th", {}, "logit z"), el("th", {}, "softmax of the three")),
      z.map((x, i) => el("tr", { dataset: { z: x, p: p[i] } }, el("td", {}, el("code", {}, names[i])), el("td", { class: "num" }, x.toFixed(1)),
        el("td", { class: "num" }, out ? pct(p[i]) : "?")))),
    el("p", {}, "p_i = e^(z_i) / Σ_j e^(z_j). What is p of the first, in percent? ", input, " ",
      el("button", { id: "drill-softmax-check", onclick: check }, "check")),
    out,
    el("p", {}, el("button", { id: "drill-shift", onclick: () => { D.shift = D.shift ? 0 : 5; D.render(); } },
      D.shift ? "take the +5 away" : "add 5 to every logit"),
    " ", el("span", { class: "note" }, D.shift ? "every logit is 5 higher, and the probabilities are exactly the same: softmax only sees differences."
      : "then check the probabilities again.")),
    next ? el("p", { class: "note" }, `Over the whole vocabulary (${S.trace.vocab} logits) the model gives “${names[0]}” p = ${pct(next[0].p)}: `
      + "the other tokens take the rest of the mass.") : null);
}

// Both drills (panels 19 and 20, found by id); `D` is their state (which question, the shift, the answers given).
export function renderDrills(_body, S) {
  const D = S.drills || (S.drills = { wi: 0, shift: 0, answer: null });
  const tid = S.trace ? S.trace.trace_id : null;
  if (D.traceId !== tid) Object.assign(D, { traceId: tid, answer: null, shift: 0 });   // new logits: a new question
  D.render = () => renderDrills(null, S);
  const words = document.querySelector("#p-drill-words .body"), soft = document.querySelector("#p-drill-softmax .body");
  if (words) clear(words, live("your prompt's own /tokenize count (no chat template)"), wordsDrill(S, D));
  if (soft) clear(soft, live("the traced logits of the token after your prompt"), softmaxDrill(S, D));
}
