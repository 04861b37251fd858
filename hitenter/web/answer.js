// The answer, where the learner is looking: the streamed text of the page's run under the prompt box (and a
// compact copy docked at the bottom of the window once the header has scrolled away), with the live numbers
// of the run: time to first token, decode tokens/s and the KV cache it holds. Every number is the engine's:
// the step timestamps and RequestOutput metrics of the /generate stream, never the page's round trips.
import { el, clear, bytes } from "./util.js";

const fmtMs = (s) => (s === null || s === undefined ? "–" : s < 1 ? `${(1000 * s).toFixed(0)} ms` : `${s.toFixed(2)} s`);

// The run's numbers from its own step events: {ttft, engineTtft, beforeEngine, tps, decodeTps, tokens, kvTokens,
// kvBlocks, kvBytes}. engineTtft: the engine's time to first token (its metric once an output arrived, else the
// end of the step that sampled the first token, both from the request's arrival); beforeEngine: the server's
// time from receiving the request to that arrival (parsing, chat template, tokenizer); ttft: the two together,
// what a client waits on the server's clock. tps: tokens after the first over the time from
// the first sampled step's end to the last one's (what a reader sees, the engine's clock). decodeTps: the
// same tokens over the decode steps' own durations (t_end - t_start: the model's work, no gaps).
export function answerStats(run) {
  const mine = run.steps.filter((s) => s.mine);
  const sampled = mine.filter((s) => s.token);
  const first = sampled[0], last = sampled[sampled.length - 1];
  const tokens = run.tokens.length;
  const engineTtft = run.ttft ?? (first ? first.t_end : null);
  const beforeEngine = run.beforeEngine ?? 0;
  const ttft = engineTtft === null ? null : engineTtft + beforeEngine;
  const after = tokens - (first ? first.accepted || 1 : 0);
  const span = first && last && last !== first ? last.t_end - first.t_end : 0;
  const decodeSteps = sampled.slice(1);
  const busy = decodeSteps.reduce((a, s) => a + (s.t_end - s.t_start), 0);
  const kv = mine[mine.length - 1];
  return { ttft, engineTtft, beforeEngine, tokens, tps: span > 0 ? after / span : null, decodeTps: busy > 0 ? after / busy : null,
    kvTokens: kv ? kv.cached_tokens ?? 0 : 0, kvBlocks: kv && kv.block_table ? kv.block_table.length : 0,
    kvBytes: kv ? kv.cached_bytes ?? 0 : 0, steps: mine.length };
}

function stat(id, label, value, data, title = "") {
  return el("span", { class: "astat", id, dataset: data, title }, el("small", {}, label), el("b", {}, value));
}

// Draw the run into `node` (the full box) and `dock` (one line, fixed at the bottom). `now` is the page clock
// (performance.now()) for the wait before the first token, shown as the page's own, never as the engine's.
export function renderAnswer(node, dock, run, now) {
  if (!run) return;
  const st = answerStats(run);
  const waiting = !run.error && !run.finish && !st.tokens;
  const waited = run.sentAt ? (now - run.sentAt) / 1000 : null;
  const ttft = st.tokens ? fmtMs(st.ttft) : waiting && waited !== null ? `${fmtMs(waited)}…` : "–";
  const state = run.error ? "rejected" : run.finish ? `done: ${run.finish}` : run.mode === "paused" ? "paused" : st.tokens ? "streaming" : "waiting";
  const stats = el("div", { class: "astats", id: "answer-stats", dataset: { state, tokens: st.tokens, ttft: st.ttft ?? "",
    engineTtft: st.engineTtft ?? "", beforeEngine: st.beforeEngine,
    tps: st.tps ?? "", decodeTps: st.decodeTps ?? "", kvTokens: st.kvTokens, kvBlocks: st.kvBlocks, steps: st.steps } },
  stat("answer-ttft", "time to first token", ttft, { engine: Boolean(st.tokens) },
    st.tokens && st.beforeEngine ? `from the server receiving the request: ${fmtMs(st.beforeEngine)} to read it (template, tokenizer), `
      + `then ${fmtMs(st.engineTtft)} in the engine` : ""),
  stat("answer-tps", "tokens/s", st.tps ? st.tps.toFixed(1) : "–"),
  stat("answer-kv", "KV cache", `${st.kvTokens} tokens · ${st.kvBlocks} blocks · ${bytes(st.kvBytes)}`),
  el("span", { class: "note" }, state === "waiting" ? "the prompt is being read (prefill)…" : `${st.tokens} tokens · ${state}`));
  // a thinking model's reply in two stages: what it thinks (its reasoning section), then what it answers
  const staged = typeof run.thinking === "string";
  const said = staged ? run.answer : run.text;
  const text = run.error ? el("span", { class: "err" }, `rejected: ${run.error.error}`)
    : [said, run.heldBack ? el("span", { class: "held" }, run.heldBack) : null, run.finish ? null : el("span", { class: "caret" }, "▍")];
  const thinking = staged ? el("div", { class: "answer-thinking", id: "answer-thinking", dataset: { chars: run.thinking.length } },
    el("small", {}, "thinking: what the model thinks (not its answer)"), run.thinking) : null;
  clear(node, stats, thinking, staged ? el("span", { class: "answer-stage" }, "answer") : null,
    el("div", { class: "answer-text", id: "answer-text", dataset: { chars: said.length, staged } }, text));
  node.dataset.rid = run.rid || "";
  node.hidden = false;
  const tail = said.length > 160 ? `…${said.slice(-160)}` : said;
  dock.dataset.tail = said.slice(-160);
  clear(dock, el("div", { class: "dockstats" }, el("b", {}, "answer"),
    el("span", { class: "note" }, ` · TTFT ${ttft} · ${st.tps ? st.tps.toFixed(1) : "–"} tok/s · KV ${st.kvTokens} tokens · ${state}`)),
  el("div", { class: "docktext" }, run.error ? "rejected" : tail.replace(/\n/g, " ↵ ")));
}

// Show the dock only while the full box is out of view (on a phone the box is not drawn: the dock always shows).
export function dockWhenHidden(node, dock) {
  new IntersectionObserver(([e]) => { dock.hidden = e.isIntersecting; }).observe(node);
}
