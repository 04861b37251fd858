// Panel 18: making it faster, in numbers from this server: batching measured (ms per decode step with one
// request and with N), the bandwidth ceiling against the measured tokens/s, this model's size in fp32 / bf16 /
// its GGUF file, the KV cache per token scaled to the vLLM paper's 13B model and a 1M-token window,
// attention over keys in tiles, speculative decoding's accepted drafts and the prompt run with it off and on (specdemo.js), and a line on
// disaggregation.
import { el, clear, bytes, live } from "./util.js";
import { answerStats } from "./answer.js";
import { specRow } from "./specdemo.js";

// OPT-13B, the vLLM paper's model: 40 layers, hidden 5120 (40 heads of 128), fp16 K and V.
const OPT13B = { layers: 40, kvDim: 5120, elem: 2 };
const MILLION = 1e6;
const gb = (n) => `${(n / 1e9).toFixed(n < 1e10 ? 2 : 0)} GB`;
const kb = (n) => `${(n / 1024).toFixed(0)} KB`;

// K and V of one token in every layer: 2 × layers × kv_heads × head_dim × bytes per element.
export function kvFacts(f) {
  const per = f.kv_bytes_per_token;
  const elems = 2 * f.layers * f.kv_heads * f.head_dim;
  const elem = elems ? per / elems : 0;
  const opt = 2 * OPT13B.layers * OPT13B.kvDim * OPT13B.elem;
  return { per, elem, opt, perM: per * MILLION, optM: opt * MILLION, opt2048: opt * 2048 };
}

export function sizeFacts(f) {
  const n = f.parameter_count;
  return { fp32: 4 * n, bf16: 2 * n, file: f.file_size, bitsPerWeight: n && f.file_size ? (8 * f.file_size) / n : null };
}

function measured(m) {
  if (!m) return el("span", { class: "note" }, "not measured yet");
  if (m.error) return el("span", { class: "err" }, m.error);
  const a = m.alone, b = m.batched;
  if (!a.ms_per_step || !b.ms_per_step) return el("span", { class: "note" }, "no step ran those requests alone (the server was busy): measure again");
  return el("span", { id: "fast-measured", dataset: { msAlone: a.ms_per_step, msBatched: b.ms_per_step, n: b.n,
    tpsAlone: a.tokens_per_s, tpsBatched: b.tokens_per_s, stepsAlone: a.steps, stepsBatched: b.steps } },
  `batch 1: ${a.ms_per_step.toFixed(1)} ms per decode step (median of ${a.steps}) → ${a.tokens_per_s.toFixed(0)} tokens/s · `,
  `batch ${b.n}: ${b.ms_per_step.toFixed(1)} ms per step (median of ${b.steps}) → `, el("b", {}, `${b.tokens_per_s.toFixed(0)} tokens/s`),
  `: ${b.n} requests for ${(b.ms_per_step / a.ms_per_step).toFixed(1)}× the time of one, `
    + `${(b.tokens_per_s / a.tokens_per_s).toFixed(1)}× the throughput (greedy, ${m.tokens} tokens each, the engine's own step times; a shared machine, so noisy).`);
}

// The disaggregation row's live part: the page's run as the prefill worker reported it, or that this server
// runs both phases in one engine.
function disaggRun(run) {
  const d = run && run.disagg;
  if (!d) return "this server runs both phases in one engine (see the outlined prefill columns in panel 7).";
  const msOf = (s) => `${(1000 * s).toFixed(1)} ms`;
  return el("span", { id: "fast-disagg", dataset: { tokens: d.prefill_tokens, kvBytes: d.kv_bytes, prefillS: d.prefill_s,
    transferS: d.transfer_s, queueS: d.prefill_queue_s, totalS: d.remote_total_s } },
  el("b", {}, "this server runs them apart: "), `your prompt's first ${d.prefill_tokens} tokens were prefilled by the worker process in `
    + `${msOf(d.prefill_s)} (after ${msOf(d.prefill_queue_s)} in its queue); their KV cache, ${bytes(d.kv_bytes)}, came back in `
    + `${msOf(d.transfer_s)} (${msOf(d.remote_total_s)} in all); this process computed the last prompt token and decoded every token after it.`);
}

// The tensor-parallel row's live part: the collectives rank 0 ran while the page's request did.
function tpRun(run, steps) {
  const t = run && run.tp;
  if (!t) return "This server runs the model in one process.";
  return el("span", { id: "fast-tp", dataset: { size: t.size, calls: t.calls, seconds: t.seconds, steps } },
    el("b", {}, `this server splits it over ${t.size} processes: `), `while your request ran (${steps} steps), this process exchanged `
      + `${t.calls} collective messages with the other${t.size > 2 ? "s" : ""} (the batch sent out, an all-reduce after each sharded `
      + `layer, the logits gathered), ${(1000 * t.seconds).toFixed(1)} ms in all.`);
}

// `ctl`: {n, measure(n), specTokens, spec, speculate(tokens)}: the N to measure with and speculation's run (kept
// across redraws: the panel is redrawn on every event).
export function renderFast(body, f, run, eng, m = null, ctl = { n: 8, measure: null }) {
  if (!f) { clear(body, live("GET /playground/api/fast"), el("p", { class: "note" }, "loading…")); return; }
  const steps = run ? run.steps.filter((s) => s.mine && s.token) : [];
  const ctx = steps.length ? steps[steps.length - 1].cached_tokens : 0;
  const perTok = f.weight_bytes + ctx * f.kv_bytes_per_token;
  const ceiling = f.bandwidth / Math.max(1, perTok);
  const rs = run ? answerStats(run) : null;      // the engine's step timestamps of the page's last run
  const tps = rs && rs.decodeTps;
  const tiles = Math.max(1, Math.ceil(ctx / f.key_tile));
  const accepted = steps.map((s) => s.accepted || 1);
  const batches = eng ? eng.steps.filter((s) => s.batch.length).slice(-40).map((s) => s.batch.length) : [];
  const kv = kvFacts(f), sz = sizeFacts(f);
  const st = f.spec_stats;
  const focusedId = body.contains(document.activeElement) && document.activeElement.tagName === "INPUT" ? document.activeElement.id : null;
  const nIn = el("input", { type: "number", id: "measure-n", value: ctl.n, min: 2, max: 16, style: { width: "4em" },
    oninput: () => { ctl.n = Number(nIn.value) || ctl.n; } });
  const row = (th, ...td) => el("tr", {}, el("th", {}, th), el("td", {}, ...td));
  clear(body, live("the engine's model, KV cache and steps; POST /playground/api/measure"),
    el("p", { class: "note" }, "Every serving trick targets one phase: prefill (heavy arithmetic on the whole prompt) or decode "
      + "(one token per step, every weight read again). The numbers below are this server's."),
    el("table", { id: "fast", dataset: { weightBytes: f.weight_bytes, bandwidth: f.bandwidth, ceiling, tiles, spec: f.spec ? f.spec.method : "",
      kvPer: kv.per, kvOpt: kv.opt, fp32: sz.fp32, bf16: sz.bf16, file: sz.file } },
    row("batching", el("button", { id: "btn-measure", onclick: () => ctl.measure && ctl.measure(Number(nIn.value)) }, "Measure batch 1 vs batch N"),
      " N = ", nIn, el("div", { id: "fast-measure" }, measured(m))),
    row("bandwidth", `a decode step reads ${bytes(perTok)} (the weights + ${ctx} cached tokens × ${bytes(f.kv_bytes_per_token)} of K/V); `
      + `${(f.bandwidth / 1e9).toFixed(1)} GB/s measured here → at most `, el("b", { id: "fast-ceiling" }, `${ceiling.toFixed(0)} tokens/s`),
    " for one request",
    tps ? el("span", { id: "fast-itl", dataset: { tps, wallTps: rs.tps ?? "" } }, `; this run's decode steps: ${tps.toFixed(0)} tokens/s, `
      + `${((100 * tps) / ceiling).toFixed(0)}% of the ceiling (${rs.tps ? rs.tps.toFixed(0) : "–"} tokens/s counting the engine loop between steps)`)
      : "; press Enter to compare with a run", m && m.alone && m.alone.tokens_per_s ? `; measured batch 1: ${m.alone.tokens_per_s.toFixed(0)} tokens/s` : ""),
    row("model size", el("span", { id: "fast-size" }, `${(f.parameter_count / 1e6).toFixed(0)}M weights: fp32 ${bytes(sz.fp32)} · bf16 ${bytes(sz.bf16)}`
      + (sz.file ? ` · ${f.file || "its GGUF"} ${bytes(sz.file)} (${sz.bitsPerWeight.toFixed(1)} bits per weight)` : "")),
    el("div", { class: "note" }, `served as ${f.weight_format}: ${bytes(f.weight_bytes)} read per step. Quantization makes the model smaller to read, so each decode step is shorter.`)),
    row("KV cache", el("span", { id: "fast-kv" }, `2 (K and V) × ${f.layers} layers × ${f.kv_heads} KV heads × ${f.head_dim} × ${kv.elem} bytes = `,
      el("b", {}, `${bytes(kv.per)} per token`), ` here; a 1M-token window would need ${gb(kv.perM)}.`),
    el("div", { class: "note", id: "fast-opt" }, `The same formula for OPT-13B (the vLLM paper: 40 layers × 5120 × 2 bytes, fp16): ${kb(kv.opt)} per token, `
      + `${gb(kv.opt2048)} for one 2048-token request, ${gb(kv.optM)} for 1M tokens.`)),
    row("attention", `the ${ctx} keys in ${tiles} tile(s) of ${f.key_tile}: each tile updates a running max and sum `
      + "(online softmax), so the full row of scores is never stored",
    el("div", { class: "keytiles", id: "fast-tiles" }, Array.from({ length: Math.min(tiles, 24) }, (_, i) => el("div", {
      title: `keys ${i * f.key_tile}–${Math.min(ctx, (i + 1) * f.key_tile) - 1}` },
    el("i", { style: { width: `${(100 * Math.min(f.key_tile, Math.max(0, ctx - i * f.key_tile))) / f.key_tile}%` } }))))),
    row("speculation", specRow(f, ctl, accepted, st)),
    row("batching now", el("span", { id: "fast-batches", dataset: { sizes: JSON.stringify(batches) } }, batches.length
      ? `requests per step, last ${batches.length} steps: ${batches.join(" ")} — one weight read serves them all (panel 7)`
      : "send a burst in panel 7: many requests share each step")),
    row("disaggregation", "prefill and decode on different machines (DistServe, Splitwise) so a long prompt never stalls "
      + "everyone's decode steps: `hitenter serve --disaggregate prefill=1,decode=1` prefills in a worker of its own and ships the KV "
      + "blocks over; ", disaggRun(run)),
    row("bigger models", "a model too big for one device is split: `--tensor-parallel-size N` shards every layer's weights "
      + "across N processes, each reading its share per step and exchanging partial results. ", tpRun(run, steps.length))));
  if (focusedId && body.querySelector(`#${focusedId}`)) body.querySelector(`#${focusedId}`).focus();   // kept across redraws
}
