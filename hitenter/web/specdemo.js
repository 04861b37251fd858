// Making it faster, speculative decoding on and off: the same prompt decoded by this server with the request
// opted out of speculation, then with it on (POST /playground/api/speculative, rounds in turn, each side's
// fastest kept), the two outputs compared token by token and the speedup measured on the engine's own step
// clock. Where the model is served without speculation the row says so and how to start it.
import { el } from "./util.js";

export const START_SPEC = "hitenter serve MODEL --speculative-method ngram";

const tps = (x) => (x ? `${x.toFixed(0)} tokens/s` : "–");

function result(r) {
  if (!r) return el("span", { class: "note" }, "not run yet");
  if (r.running) return el("span", { class: "note" }, "running: speculation off, then on (twice each)…");
  if (r.error) return el("span", { class: "err" }, r.error);
  const { off, on } = r, st = on.spec || {};
  const rate = st.num_draft_tokens ? `${((100 * st.num_accepted_tokens) / st.num_draft_tokens).toFixed(0)}%` : "–";
  const gain = r.speedup ? `${r.speedup.toFixed(2)}×` : "–";
  const verdict = !r.speedup ? "" : r.speedup >= 1.05 ? "faster" : r.speedup <= 0.95
    ? "slower here: rejected drafts still cost a verification pass" : "no measurable difference here";
  return el("div", { id: "spec-compare", dataset: { same: r.same_ids, tokens: r.tokens, speedup: r.speedup ?? "",
    stepsOff: off.steps, stepsOn: on.steps, tpsOff: off.tokens_per_s ?? "", tpsOn: on.tokens_per_s ?? "",
    drafted: st.num_draft_tokens ?? 0, accepted: st.num_accepted_tokens ?? 0 } },
  el("div", {}, el("b", { class: r.same_ids ? "ok" : "err" }, r.same_ids ? "identical output" : "the outputs differ"),
    ` · ${r.tokens} tokens, the same token ids in all ${2 * r.rounds} runs (${r.spec.method}, up to ${r.spec.k} drafted per step)`),
  el("div", {}, `off: ${off.steps} steps for ${r.tokens} tokens, ${tps(off.tokens_per_s)} · on: ${on.steps} steps `
    + `(${on.tokens_per_step ? on.tokens_per_step.toFixed(2) : "–"} tokens per step), ${tps(on.tokens_per_s)} → `,
  el("b", { id: "spec-speedup" }, gain), verdict ? ` (${verdict})` : ""),
  el("div", { class: "note" }, `drafted ${st.num_draft_tokens ?? 0}, accepted ${st.num_accepted_tokens ?? 0} (${rate}) in `
    + `${st.num_verify_steps ?? 0} verification passes. Times: the engine's step clock from the first token to the last, the `
    + `fastest of ${r.rounds} rounds per side (each round: ${r.round_s.map(([a, b]) => `${(1000 * a).toFixed(0)} / ${(1000 * b).toFixed(0)} ms`).join(", ")}); `
    + "n-gram lookup pays off where the text repeats earlier tokens (copying, lists, code edits)."),
  el("pre", { class: "spec-text" }, on.text));
}

// The speculation row of panel 18. `f`: GET /fast; `ctl`: {specTokens, spec (the last result), speculate(tokens)}.
export function specRow(f, ctl, accepted, st) {
  if (!f.spec) {
    return el("span", { id: "fast-spec", dataset: { on: "false" } },
      "off on this server, so it cannot be run both ways here: start it with ", el("code", {}, START_SPEC),
      " (prompt lookup: no second model) or --speculative-model NAME (a small draft model with the same tokenizer), "
      + "then press the button this row shows to decode your prompt with speculation off and on.");
  }
  const nIn = el("input", { type: "number", id: "spec-tokens", value: ctl.specTokens || 64, min: 2, max: 256, style: { width: "4.5em" },
    oninput: () => { ctl.specTokens = Number(nIn.value) || ctl.specTokens; } });
  return el("span", { id: "fast-spec", dataset: { on: "true", accepted: JSON.stringify(accepted), drafted: st ? st.draft_tokens : "",
    acceptedTotal: st ? st.accepted_tokens : "" } },
  `${f.spec.method}, up to ${f.spec.k} drafted per step, the model checks them in one pass; tokens per step of this run: `,
  el("b", {}, accepted.join(" ") || "–"),
  st ? ` · since the server started: ${st.accepted_tokens} of ${st.draft_tokens} drafted tokens accepted`
    + ` (${(100 * st.acceptance_rate).toFixed(0)}%) in ${st.drafts} verification passes` : "",
  el("div", { class: "controls" }, el("button", { id: "btn-spec", disabled: Boolean(ctl.spec && ctl.spec.running),
    onclick: () => ctl.speculate && ctl.speculate(Number(nIn.value)) }, "Run my prompt with speculation off and on"), " tokens ", nIn),
  el("div", { id: "spec-result" }, result(ctl.spec)));
}
