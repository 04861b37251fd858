// Panels 4, 5 and 8: the generation loop token by token, branching, and why it stopped.
import { el, clear, visible, pct, probColour, tokenChip, live } from "./util.js";

// The probability the chosen token had in the final (sampled-from) distribution of its step.
export function chosenProb(tok) {
  const t = tok.trace;
  if (!t) return null;
  const i = t.candidate_ids.indexOf(tok.piece.id);
  return i < 0 ? null : t.stages[t.stages.length - 1].probs[i];
}

function alternatives(tok, k = 6) {
  const t = tok.trace;
  if (!t) return "";
  const raw = t.stages[0].probs;
  return t.pieces.slice(0, k).map((p, i) => `${p.id === tok.piece.id ? "▶" : " "} ${visible(p.text)}  ${pct(raw[i])}`).join("\n");
}

// Shortest repeating cycle at the end of `ids` (seen at least twice): {len, start} or null.
export function findCycle(ids) {
  const n = ids.length;
  for (let len = 1; 2 * len <= n; len++) {
    let start = n - len;
    while (start > 0 && ids[start - 1] === ids[start - 1 + len]) start--;
    if (n - start >= 2 * len) return { len, start };
  }
  return null;
}

export function genChips(tokens, { onPick, cycle = null, span = null, mark = null } = {}) {
  return tokens.map((tok, i) => {
    const p = chosenProb(tok);
    const cls = [cycle && i >= cycle.start ? "cycle" : "", span && i >= span[0] && i <= span[1] ? "stopspan" : "",
      mark === i ? "chosen-branch" : ""].join(" ");
    return tokenChip(tok.piece, { class: cls, style: { background: p === null ? "" : probColour(p) },
      title: `step ${i}: p = ${pct(p)}\n${alternatives(tok)}${onPick ? "\nclick to choose another token" : ""}`,
      dataset: { index: i, prob: p ?? "", rid: tok.rid }, onclick: onPick ? (e) => onPick(i, e) : null });
  });
}

export function renderLoop(body, run, onPick) {
  const ids = run.tokens.map((t) => t.piece.id);
  const cycle = run.params.ignore_eos && run.finish ? findCycle(ids) : null;
  const noCycle = run.params.ignore_eos && run.finish && !cycle
    ? el("p", { class: "note", id: "no-cycle", dataset: { n: ids.length } }, `no repeating loop in these ${ids.length} tokens: `
      + "greedy decoding ran to the budget without repeating itself (a larger max_tokens may show one).") : null;
  clear(body, live("one RequestOutput per engine step; colours = p of the chosen token"),
    el("p", { class: "note" }, `mode: ${run.mode} · ${run.tokens.length} tokens generated · each token is one more trip through the model`),
    run.stepInfo ? el("p", { class: "note", id: "step-note", dataset: { n: run.stepInfo.n, seed: run.stepInfo.seed, same: run.stepInfo.same } },
      `Step sends the same request as Enter (this prompt, seed ${run.stepInfo.seed}, the sliders as set now) with max_tokens = `
      + `${run.stepInfo.n}: its token ${run.stepInfo.n - 1} is the very draw Enter makes, and the prompt comes from the prefix cache.`
      + (run.stepInfo.same ? "" : " The settings changed since the last step, so the earlier tokens were drawn again with them.")) : null,
    el("div", { class: "row gen", id: "gen-tokens", dataset: { ids: JSON.stringify(ids), finish: run.finish || "" } },
      genChips(run.tokens, { onPick, cycle, span: run.stopSpan })),
    cycle ? el("p", { class: "err", id: "cycle", dataset: { len: cycle.len, start: cycle.start } },
      `repeating cycle: ${cycle.len} token(s) repeated from token ${cycle.start} on`) : noCycle,
    el("pre", { id: "gen-text" }, run.text + (run.heldBack ? `⟨held back: ${run.heldBack}⟩` : "")),
    el("p", { class: "note" }, "Hover a token for the alternatives; click it to branch (panel 5)."));
}

export function renderBranch(body, run, branch) {
  if (!branch) {
    clear(body, live("a second request that shares the prefix"), el("p", { class: "note" },
      "Click any generated token in panel 4, pick another candidate, and the engine continues from there."));
    return;
  }
  const orig = run.tokens.slice(branch.at);
  const hit = branch.cached;
  clear(body, live("the branch request's num_cached_tokens (prefix-cache hit)"),
    el("p", { id: "branch-info", dataset: { cached: hit ?? "", prefix: branch.prefixLen, at: branch.at } },
      `Branch at token ${branch.at}: prompt + ${branch.at} generated tokens + your choice = ${branch.prefixLen} tokens. `,
      hit === null ? "running…" : `The engine found ${hit} of them in the prefix cache (full KV blocks reused, not recomputed).`),
    el("div", { class: "side" },
      el("div", {}, el("b", {}, "original"), el("div", { class: "row", id: "branch-orig" }, genChips(orig, { mark: 0 }))),
      el("div", {}, el("b", {}, "your branch"), el("div", { class: "row", id: "branch-new" }, genChips(branch.tokens, { mark: 0 })))));
}

export function renderStop(body, run, eog) {
  const n = run.tokens.length;
  const max = run.params.max_tokens || 0;
  const last = run.tokens[n - 1];
  let endInfo = null;
  // an end token: stop_reason is null (the server names it in end_token); a stop_token_ids hit: its id
  const endId = run.endToken ? run.endToken.id : typeof run.stopReason === "number" ? run.stopReason : null;
  if (run.finish === "stop" && endId !== null) {
    const i = last && last.trace ? last.trace.candidate_ids.indexOf(endId) : -1;
    const piece = run.endToken || eog.find((p) => p.id === endId) || last.piece;
    const p = i >= 0 ? last.trace.stages[0].probs[i] : null;
    endInfo = el("p", { id: "end-token", dataset: { id: endId, p: p ?? "" } },
      run.endToken ? "stopped on the model's end-of-generation token " : "stopped on a stop token ", tokenChip(piece),
      p === null ? "" : `, sampled with p = ${pct(p)}`, ": the model itself said it was done.");
  }
  clear(body, live("finish_reason / stop_reason of the RequestOutput"),
    el("p", { id: "finish", dataset: { reason: run.finish || "", stop: run.stopReason ?? "" } },
      run.finish ? `finish_reason: ${run.finish}` : run.error ? "rejected before any token: nothing was generated" : "running…",
      run.finish === "stop" && typeof run.stopReason === "string" ? ` (stop string "${run.stopReason}")` : ""),
    endInfo,
    run.stopSpan ? el("p", { id: "stop-span", dataset: { first: run.stopSpan[0], last: run.stopSpan[1] } },
      `the stop string spans tokens ${run.stopSpan[0]}–${run.stopSpan[1]}; its text was held back and never sent.`) : null,
    el("p", { id: "held", dataset: { held: run.heldBack || "" } }, "held back (a stop string might be forming): ",
      el("code", {}, run.heldBack ? visible(run.heldBack) : "nothing")),
    el("div", { class: "meter", title: "max_tokens budget" }, el("div", { style: { width: `${max ? (100 * n) / max : 0}%` } })),
    el("p", { class: "note", id: "budget", dataset: { used: n, max } }, `${n} of max_tokens = ${max} used`),
    el("p", { class: "note" }, "The three ways to stop: an end-of-generation token, a stop string, or the max_tokens budget."));
}
