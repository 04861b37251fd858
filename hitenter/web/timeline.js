// Panel 6: the engine's own step timestamps for this request: prefill (and its chunks), then decodes.
import { el, clear, ms, live } from "./util.js";

export function renderTimeline(body, run) {
  const steps = run.steps.filter((s) => s.mine);
  if (!steps.length) {
    clear(body, live("EngineEvent t_start / t_end"), el("p", { class: "note", id: "timeline-empty", dataset: { steps: 0 } },
      run.error ? "zero engine steps: the request was rejected before any work." : "Press Enter to see the steps."));
    return;
  }
  const end = Math.max(...steps.map((s) => s.t_end));
  const x = (t) => `${(100 * t) / end}%`;
  const bars = steps.map((s, i) => el("div", { class: "tl-row" }, el("div", {
    class: `tl-bar ${s.mine.kind}`, style: { left: x(s.t_start), width: `max(2px, ${x(s.t_end - s.t_start)})` },
    title: `step ${s.step_id}: ${s.mine.kind} of ${s.mine.num_tokens} token(s) from position ${s.mine.start}; `
      + `${ms(s.t_end - s.t_start)} (model ${ms(s.t_model)}), batch of ${s.batch.length}`,
    dataset: { kind: s.mine.kind, start: s.t_start, end: s.t_end, tokens: s.mine.num_tokens, step: s.step_id, i } },
  `${s.mine.kind === "prefill" ? "prefill" : "d"} ${s.mine.num_tokens}`)));
  const prefills = steps.filter((s) => s.mine.kind === "prefill");
  const firstTok = steps.find((s) => s.mine.sampled !== null && s.mine.sampled !== undefined);
  const decodes = steps.filter((s) => s.mine.kind === "decode").map((s) => s.t_end - s.t_start);
  // between tokens: consecutive sampling steps' ends on the engine's clock (so the page's own work and round
  // trips are not in it); the decode steps' own durations are the model's part of that
  const ends = steps.filter((s) => s.token).map((s) => s.t_end);
  const gaps = ends.slice(1).map((t, i) => t - ends[i]);
  const meanItl = gaps.length ? gaps.reduce((a, b) => a + b, 0) / gaps.length : null;
  const meanDecode = decodes.length ? decodes.reduce((a, b) => a + b, 0) / decodes.length : null;
  clear(body, live("EngineEvent t_start / t_end of every step that ran this request"),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: { background: "var(--prefill)" } }), "prefill"),
      el("span", {}, el("i", { style: { background: "var(--decode)" } }), "decode (one token each)")),
    el("div", { class: "timeline", id: "timeline", dataset: { steps: steps.length, prefills: prefills.length,
      cached: run.cached ?? 0, ttft: run.ttft ?? "", first_token_end: firstTok ? firstTok.t_end : "" } }, bars),
    el("p", { id: "ttft", dataset: { beforeEngine: run.beforeEngine ?? "" } }, `time to first token: `
      + (run.beforeEngine ? `${ms(run.beforeEngine + run.ttft)} = ${ms(run.beforeEngine)} before the engine (template, tokenizer) + ` : "")
      + `${ms(run.ttft)} in the engine (waiting + ${prefills.length} prefill step${prefills.length === 1 ? "" : "s"}`
      + `${prefills.length > 1 ? ": the long prompt was chunked" : ""})`),
    run.cached ? el("p", { class: "note" }, `${run.cached} prompt tokens were already in the prefix cache and were not recomputed.`) : null,
    el("p", { id: "tbt", dataset: { mean: meanItl ?? "", decode: meanDecode ?? "" } }, `time between tokens: ${ms(meanItl)} on average `
      + `(decode steps themselves: ${ms(meanDecode)}; the rest is the engine loop between steps)`),
    el("p", { class: "note" }, "Prefill reads the whole prompt in parallel; each decode step computes one token. Every time here is "
      + "the engine's own step timestamps (t_start, t_end from the request's arrival), not the page's clock; the page asks for "
      + "nothing else while this request runs. Relative times, this machine."));
}
