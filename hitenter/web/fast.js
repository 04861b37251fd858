// Panel 18: how it goes fast, in numbers from this server: the weight format and the bytes a decode step
// reads against the measured memory bandwidth, attention over keys in tiles, speculative decoding's
// accepted tokens per step (when the server runs with it), and continuous batching.
import { el, clear, bytes, live } from "./util.js";

export function renderFast(body, f, run, eng) {
  if (!f) { clear(body, live("GET /playground/api/fast"), el("p", { class: "note" }, "loading…")); return; }
  const steps = run ? run.steps.filter((s) => s.mine && s.token) : [];
  const ctx = steps.length ? steps[steps.length - 1].cached_tokens : 0;
  const perTok = f.weight_bytes + ctx * f.kv_bytes_per_token;
  const ceiling = f.bandwidth / Math.max(1, perTok);
  const itl = run && run.itl && run.itl.length ? run.itl.reduce((a, b) => a + b, 0) / run.itl.length : null;
  const tiles = Math.max(1, Math.ceil(ctx / f.key_tile));
  const accepted = steps.map((s) => s.accepted || 1);
  const batches = eng ? eng.steps.filter((s) => s.batch.length).slice(-40).map((s) => s.batch.length) : [];
  clear(body, live("the engine's model, KV cache and steps"),
    el("table", { id: "fast", dataset: { weightBytes: f.weight_bytes, bandwidth: f.bandwidth, ceiling, tiles, spec: f.spec ? f.spec.method : "" } },
      el("tr", {}, el("th", {}, "weights"), el("td", {}, `${f.weight_format}: ${bytes(f.weight_bytes)}, all read once per decode step`)),
      el("tr", {}, el("th", {}, "per token"), el("td", {}, `${bytes(perTok)} = weights + ${ctx} cached tokens × ${bytes(f.kv_bytes_per_token)} of K/V`)),
      el("tr", {}, el("th", {}, "bandwidth"), el("td", {}, `${(f.bandwidth / 1e9).toFixed(1)} GB/s measured here → at most `,
        el("b", {}, `${ceiling.toFixed(0)} tokens/s`), " for one request",
      itl ? ` (this run: ${(1 / itl).toFixed(0)} tokens/s)` : "")),
      el("tr", {}, el("th", {}, "attention"), el("td", {}, `the ${ctx} keys in ${tiles} tile(s) of ${f.key_tile}: each tile updates a running max and sum `
        + "(online softmax), so the full row of scores is never stored",
      el("div", { class: "keytiles", id: "fast-tiles" }, Array.from({ length: Math.min(tiles, 24) }, (_, i) => el("div", {
        title: `keys ${i * f.key_tile}–${Math.min(ctx, (i + 1) * f.key_tile) - 1}` },
      el("i", { style: { width: `${(100 * Math.min(f.key_tile, Math.max(0, ctx - i * f.key_tile))) / f.key_tile}%` } })))))),
      el("tr", {}, el("th", {}, "speculation"), el("td", { id: "fast-spec" }, f.spec
        ? [`${f.spec.method}, ${f.spec.k} drafted per step; tokens accepted per step: `, el("b", {}, accepted.join(" ") || "–")]
        : "off on this server (start it with a draft model to see drafted and accepted tokens)")),
      el("tr", {}, el("th", {}, "batching"), el("td", { id: "fast-batches", dataset: { sizes: JSON.stringify(batches) } }, batches.length
        ? `requests per step, last ${batches.length} steps: ${batches.join(" ")} — one weight read serves them all (panel 7)`
        : "send a burst in panel 7: many requests share each step"))));
}
