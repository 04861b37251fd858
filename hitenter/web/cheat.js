// Panel 21: the cheat sheet. One line per idea of the walk, each with this model's and this run's number.
import { el, clear, bytes, ms, live } from "./util.js";
import { countWords } from "./drills.js";

export function renderCheat(body, S, info) {
  const m = info || {};
  const mine = (x, name) => (x && name === m.name ? x : null);      // nothing from another model's run or trace
  const run = mine(S.run, S.run && S.run.model), tr = mine(S.trace, S.tracedModel), f = S.fast;
  const u = run && run.userTokens;
  const words = run ? countWords(run.promptText) : 0;
  const itl = run && run.itl && run.itl.length ? run.itl.reduce((a, b) => a + b, 0) / run.itl.length : null;
  const rows = [
    ["tokens", "≈ 4 characters or ¾ of a word of English; tokens ≈ words ÷ 0.75; count with the real tokenizer",
      u && u.tokens ? `your text: ${(u.chars / u.tokens).toFixed(1)} characters and ${(words / u.tokens).toFixed(2)} words per token` : ""],
    ["ids → vectors", "each id picks one row of the embedding table", tr ? `${tr.vocab} rows × ${tr.dim} numbers` : ""],
    ["positions", "RoPE turns each query/key pair by position × θ_i: word order lives only here", ""],
    ["attention", "softmax(Q·Kᵀ/√d) weights, then the weighted mix of V; causal: never the future",
      tr ? `${tr.layers} layers × ${tr.heads} heads (${tr.kv_heads} KV heads)` : ""],
    ["logits", "one score per vocabulary token from the LM head", tr ? `${tr.vocab} scores per step` : ""],
    ["softmax", "p_i = e^(z_i) / Σ_j e^(z_j); adding a constant to every z changes nothing", ""],
    ["greedy", "temperature 0: the top token, no dice, the same output every time", ""],
    ["temperature", "z / T before softmax: < 1 sharper, > 1 flatter; 0.2 focused, 0.8 chatty, 2 falls apart", ""],
    ["top-k / top-p", "keep the k best / the smallest set reaching p, then redraw among them", ""],
    ["seed", "the same seed and settings draw the same tokens (Replay checks it)", ""],
    ["the loop", "N output tokens = N forward passes, one after another; tokens are never revised",
      run && run.tokens.length ? `this run: ${run.tokens.length} tokens` : ""],
    ["stopping", "the end-of-sequence token, a stop string, or max_tokens", run && run.finish ? `this run: ${run.finish}` : ""],
    ["window", "prompt tokens + max_tokens ≤ the context window, or the request is refused before any work",
      m.max_model_len ? `this server: ${m.max_model_len} tokens` : ""],
    ["prefill / decode", "prefill reads the prompt in one parallel pass (time to first token); decode is one memory-bound step per token",
      run && run.ttft !== null ? `this run: TTFT ${ms(run.ttft)}, ${ms(itl)} between tokens` : ""],
    ["KV cache", "K and V of every earlier token kept, so decode does not redo the prompt: 2 × layers × KV heads × head dim × bytes per token",
      f ? `this model: ${bytes(f.kv_bytes_per_token)} per token (OPT-13B: 800 KB)` : ""],
    ["faster", "batching shares each weight read; quantization shrinks it; speculation checks several drafted tokens per pass; "
      + "disaggregation splits prefill from decode", S.measured && S.measured.batched && S.measured.batched.tokens_per_s
      ? `batch ${S.measured.batched.n}: ${S.measured.batched.tokens_per_s.toFixed(0)} vs ${S.measured.alone.tokens_per_s.toFixed(0)} tokens/s alone` : ""],
  ];
  clear(body, live("this page's state: the run, the trace and /fast"),
    el("table", { id: "cheat", dataset: { rows: rows.length } }, el("tr", {}, el("th", {}, "idea"), el("th", {}, "the rule"), el("th", {}, "here")),
      rows.map(([k, rule, here]) => el("tr", { dataset: { key: k } }, el("th", {}, k), el("td", {}, rule), el("td", { class: "note here" }, here)))));
}
