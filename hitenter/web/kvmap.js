// Panel 7: this request's KV cache growing, and the live map of the engine's whole paged cache.
import { el, clear, bytes, colourOf, live } from "./util.js";

const MAX_DRAWN = 512;

export function renderRequestKV(node, run) {
  const s = [...run.steps].reverse().find((x) => x.mine);
  if (!s) { clear(node, el("p", { class: "note" }, "No KV cache yet.")); return; }
  const bs = run.blockSize;
  const table = s.block_table;
  const cells = table.map((b, i) => {
    const fill = Math.max(0, Math.min(bs, s.cached_tokens - i * bs));
    return el("div", { class: "reqblk", title: `block ${b}: ${fill}/${bs} tokens`, dataset: { block: b, fill } },
      el("i", { style: { width: `${(100 * fill) / bs}%` } }), el("span", {}, `#${b}`));
  });
  clear(node, el("p", { id: "req-kv", dataset: { tokens: s.cached_tokens, bytes: s.cached_bytes, blocks: table.length } },
    `this request: ${s.cached_tokens} tokens in the cache = ${bytes(s.cached_bytes)} `
    + `(${bytes(run.bytesPerToken)} per token) in ${table.length} block(s) of ${bs} tokens`
    + (s.freed ? " (freed now that it finished; its full blocks stay in the prefix cache)" : "")),
  el("div", { class: "reqblocks", id: "req-blocks" }, cells), hybridMemory(run, s));
}

// A hybrid model (attention layers beside recurrent ones): what each kind of layer holds for this request.
// The attention layers' K/V grows with every token; a recurrent layer keeps one fixed-size state.
function hybridMemory(run, s) {
  const kinds = run.layerTypes;
  if (!kinds.length || !run.stateBytes) return null;
  const counts = {};
  kinds.forEach((k) => { counts[k] = (counts[k] || 0) + 1; });
  const recurrent = Object.keys(counts).filter((k) => k !== "attention" && k !== "ffn");
  const first = run.steps.find((x) => x.mine);
  const resumed = first && first.mine.start > 0 ? first.mine.start : 0;
  const kv = s.cached_bytes, st = run.stateBytes, most = Math.max(kv, st, 1);
  const bar = (id, label, b, note) => el("div", { class: "membar", id, dataset: { bytes: b } },
    el("span", {}, label), el("i", { style: { width: `${(100 * b) / most}%` } }), el("span", {}, `${bytes(b)} ${note}`));
  return el("div", { id: "hybrid-memory" },
    el("p", {}, `a hybrid model: ${counts.attention || 0} attention layer(s) keep K/V for every token; `
      + `${recurrent.map((k) => `${counts[k]} ${k.replace("_", " ")}`).join(", ")} layer(s) keep one state per sequence`),
    bar("mem-kv", "attention K/V", kv, `(${s.cached_tokens} tokens, grows)`),
    bar("mem-state", "recurrent state", st, "(the same at any length)"),
    el("p", { id: "state-resume", dataset: { resumed } }, resumed
      ? `resumed from a state snapshot at token ${resumed}: the earlier turn was not read again`
      : "started from a zero state (no snapshot of this prefix yet; the next turn will resume from one)"));
}

export function renderBlockMap(node, eng, mine) {
  const kv = eng.kv;
  if (!kv) return;
  const byId = new Map(kv.blocks.map((b) => [b[0], b]));
  const cells = [];
  for (let id = 0; id < Math.min(kv.num_blocks, MAX_DRAWN); id++) {
    const [, ref, owners, hashed] = byId.get(id) || [id, 0, [], false];
    const free = ref === 0;
    const colour = owners.length ? colourOf(owners[0]) : "";
    cells.push(el("div", {
      class: `blk ${free && hashed ? "hashed-free" : ""} ${ref > 1 ? "shared" : ""}`,
      style: { background: colour, outline: owners.includes(mine) ? "2px solid #222" : "" },
      title: `block ${id}: ref ${ref}${owners.length ? ` · ${owners.join(", ")}` : ""}${hashed ? " · hashed (prefix-cache hittable)" : ""}${free ? " · free" : ""}`,
      dataset: { blockId: id, ref, owners: owners.join(","), hashed, free } }, ref > 1 ? `×${ref}` : id));
  }
  const batches = eng.steps.filter((s) => s.batch.length).slice(-60).map((s) => el("div", { class: "batchcol", title: `step ${s.step_id}: ${s.batch.length} request(s)`,
    dataset: { step: s.step_id, size: s.batch.length } },
  s.batch.map(([rid, kind, , n]) => el("div", { class: kind, style: { background: colourOf(rid) }, title: `${rid} ${kind} ${n}` }))));
  clear(node,
    el("p", { id: "kv-summary", dataset: { free: kv.num_free, total: kv.num_blocks, step: kv.step_counter } },
      `whole cache: ${kv.num_blocks} blocks of ${kv.block_size} tokens · ${kv.num_free} free · engine step ${kv.step_counter}`),
    el("div", { class: "legend" }, el("span", {}, "colour = owning request"), el("span", {}, "×n = shared prefix block, n references"),
      el("span", {}, el("i", { class: "hashed-free", style: { border: "1px solid #ccc" } }), "free but still cached (hittable)"),
      el("span", {}, el("i", { style: { border: "1px solid #ccc" } }), "free")),
    el("div", { class: "blockmap", id: "blockmap" }, cells),
    kv.num_blocks > MAX_DRAWN ? el("p", { class: "note" }, `(first ${MAX_DRAWN} blocks drawn)`) : null,
    el("p", { class: "note", id: "free-list" }, `free list, evicted from the front: ${kv.free_order.slice(0, 24).join(" ")}${kv.free_order.length > 24 ? " …" : ""}`),
    el("p", { class: "note" }, "continuous batching, one column per engine step (outlined = prefill):"),
    el("div", { class: "batchstrip", id: "batchstrip" }, batches),
    el("p", { id: "preemptions", dataset: { n: eng.preempted.length } },
      eng.preempted.length ? `preempted (blocks taken back, recomputed later): ${eng.preempted.slice(-8).join(", ")}` : "no preemptions yet"));
}

export function kvPanel(body, onBurst) {
  const n = el("input", { type: "number", id: "burst-n", value: 6, min: 1, max: 32, style: { width: "4em" } });
  const req = el("div", { id: "kv-request" });
  const map = el("div", { id: "kv-map" });
  clear(body, live("kv_manager.snapshot() after every engine step, and its KV events"), req,
    el("p", {}, el("button", { id: "btn-burst", onclick: () => onBurst(Number(n.value)) }, "Send N concurrent requests"), " N = ", n),
    map);
  return { req, map };
}
