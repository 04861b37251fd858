// Panels 9-12: break it, determinism under load, the toy trigram model, the request inspector.
import { el, clear, visible, pct, tokenChip, live } from "./util.js";
import { genChips, findCycle } from "./loop.js";

export function breakPanel(body, actions) {
  const out = el("div", { id: "break-out" });
  const eosOut = el("div", { id: "eos-out" });
  const tempOut = el("div", { id: "temps-out" });
  const overOut = el("div", { id: "overrule-out" });
  const group = (id, ...kids) => el("div", { class: "breakit", dataset: { for: id } }, ...kids);
  clear(body, live("the engine's answers to requests built to fail"),
    group("btn-overflow", el("p", {}, el("button", { id: "btn-overflow", onclick: () => actions.overflow() }, "Overflow the context window"),
      " the server repeats your prompt's tokens until prompt + max_tokens is one token more than this model's window, "
      + "and sends it as a real request; then the same ids go to POST /v1/completions. ", el("span", { id: "window-note", class: "note" })),
    out),
    group("btn-ignore-eos", el("p", {}, el("button", { id: "btn-ignore-eos", onclick: () => actions.ignoreEos(eosOut) }, "Ignore the end token"),
      " “Say hi”, greedy (temperature 0, max_tokens 40), without and with ignore_eos: the model's end token stops the first; "
      + "nothing but the budget stops the second. Your own settings are left as they are."),
    eosOut),
    group("btn-temps", el("p", {}, el("button", { id: "btn-temps", onclick: () => actions.temps(tempOut) }, "Turn the temperature up"),
      " your prompt, the same seed, at temperature 0.2, 1 and 2 side by side (top-k and top-p off): watch the text fall apart."),
    tempOut),
    group("btn-overrule", el("p", {}, el("button", { id: "btn-overrule", onclick: () => actions.overrule(overOut) }, "Overrule one token"),
      " your prompt, greedy: halfway through the answer the model's choice is replaced by its second choice, and the engine "
      + "continues from there. Tokens are never revised: everything after the overruled token follows from it. "
      + "(By hand: click any token in panel 4.)"),
    overOut));
  return out;
}

// The window a request gets on this server, and whether it is deliberately smaller than the model's own.
export function windowNote(m) {
  if (!m) return "";
  return m.context_length && m.max_model_len < m.context_length
    ? `This server gives each request a deliberately small window of ${m.max_model_len} tokens (started with --max-model-len `
      + `${m.max_model_len}; the model was trained on ${m.context_length}), so the overflowing prompt is ${m.max_model_len} tokens, not ${m.context_length}.`
    : `This server gives each request the model's full window of ${m.max_model_len} tokens; start it with --max-model-len 512 for a deliberately small one.`;
}

// The same overflowing ids sent to the OpenAI endpoint: its status and message.
export function renderV1Check(node, status, j, ev) {
  const msg = j && j.error ? j.error.message : JSON.stringify(j);
  node.append(el("p", { id: "v1-overflow", dataset: { status, nPrompt: ev.n_prompt_tokens, maxTokens: ev.max_tokens } },
    el("b", {}, `POST /v1/completions with the same ${ev.n_prompt_tokens} ids and max_tokens ${ev.max_tokens} → HTTP ${status}: `),
    el("span", { class: status === 400 ? "err" : "" }, msg)));
}

function runRow(r, id) {
  const ids = r.tokens.map((t) => t.piece.id);
  return el("div", { id, dataset: { ids: JSON.stringify(ids), finish: r.finish || (r.error ? "error" : ""), n: ids.length } },
    el("div", { class: "row" }, genChips(r.tokens)), el("pre", {}, r.text));
}

// Before / after of the end token: the same greedy request without and with ignore_eos.
export function renderEosCompare(node, before, after) {
  const cycle = findCycle(after.tokens.map((t) => t.piece.id));
  const why = (r) => (r.error ? `rejected: ${r.error.error}` : r.finish === "stop" && r.endToken
    ? `finish_reason stop after ${r.tokens.length} tokens: the model's end token ${r.endToken.text}`
    : `finish_reason ${r.finish} after ${r.tokens.length} tokens`);
  clear(node, el("div", { class: "side", id: "eos-compare" },
    el("div", {}, el("b", {}, "without ignore_eos"), el("p", { class: "note" }, why(before)), runRow(before, "eos-before")),
    el("div", {}, el("b", {}, "with ignore_eos"), el("p", { class: "note" }, why(after)
      + (cycle ? ` · repeating a ${cycle.len}-token cycle from token ${cycle.start}` : "")), runRow(after, "eos-after"))),
  before.finish === "stop" ? null : el("p", { class: "note" },
    "This model did not emit its end token within 40 tokens here, so both ran to the budget."));
}

// Three continuations at rising temperature, with how likely the model itself found each chosen token.
export function renderTemps(node, runs) {
  clear(node, el("div", { class: "side3", id: "temps-side" }, runs.map((r) => {
    const raw = r.tokens.filter((t) => t.trace).map((t) => {
      const i = t.trace.candidate_ids.indexOf(t.piece.id);
      return i < 0 ? 0 : t.trace.stages[0].probs[i];
    });
    const mean = raw.length ? raw.reduce((a, b) => a + b, 0) / raw.length : 0;
    return el("div", { class: "temprow", dataset: { temperature: r.params.temperature, meanRawP: mean } },
      el("b", {}, `temperature ${r.params.temperature}`),
      el("span", { class: "note" }, ` · mean p the model gave its chosen tokens (at T = 1): ${pct(mean)}`),
      runRow(r, `temp-${String(r.params.temperature).replace(".", "_")}`));
  })));
}

// Before / after of an overruled token: the greedy answer, and the same answer with token `at` replaced.
export function renderOverrule(node, before, after, at) {
  const orig = before.tokens[at], alt = after.tokens[at];
  const rawP = (tok, id) => { const i = tok.trace ? tok.trace.candidate_ids.indexOf(id) : -1; return i < 0 ? null : tok.trace.stages[0].probs[i]; };
  const rest = (r) => r.tokens.slice(at + 1).map((t) => t.piece.id);
  const a = rest(before), b = rest(after);
  const differ = a.filter((id, i) => b[i] !== id).length + Math.max(0, b.length - a.length);
  clear(node, el("div", { id: "overrule", dataset: { at, chosen: orig.piece.id, alt: alt.piece.id, samePrefix:
    JSON.stringify(before.tokens.slice(0, at).map((t) => t.piece.id)) === JSON.stringify(after.tokens.slice(0, at).map((t) => t.piece.id)),
  differ, after: JSON.stringify(after.tokens.map((t) => t.piece.id)) } },
  el("p", {}, `token ${at}: the model chose “${visible(orig.piece.text)}” (p = ${pct(rawP(orig, orig.piece.id))}); overruled with its next choice `
    + `“${visible(alt.piece.text)}” (p = ${pct(rawP(orig, alt.piece.id))}). The first ${at} tokens are the same; `, el("b", {}, `${differ} of the `
    + `${Math.max(a.length, b.length)} after it differ`), "."),
  el("div", { class: "side" },
    el("div", {}, el("b", {}, "the model's answer"), el("div", { class: "row", id: "overrule-before" }, genChips(before.tokens, { mark: at })),
      el("pre", {}, before.text)),
    el("div", {}, el("b", {}, "one token overruled"), el("div", { class: "row", id: "overrule-after" }, genChips(after.tokens, { mark: at })),
      el("pre", {}, after.text)))));
}

// A refused request: a context overflow shows its arithmetic; any other refusal just its reason.
export function renderRejected(node, ev) {
  if (!ev.overflow) {
    clear(node, el("div", { id: "rejected", dataset: { kind: ev.kind, stepsBefore: ev.step_counter, stepsAfter: ev.step_counter_after ?? "" } },
      el("p", { class: "err" }, `rejected (${ev.kind}): ${ev.error}`),
      el("p", { class: "note" }, "The engine refused the request before running it; nothing was queued.")));
    return;
  }
  clear(node, el("div", { id: "overflow", dataset: { nPrompt: ev.n_prompt_tokens, nCtx: ev.n_ctx, maxTokens: ev.max_tokens ?? "",
    stepsBefore: ev.step_counter, stepsAfter: ev.step_counter_after } },
  el("p", { class: "err" }, `rejected (${ev.kind}): ${ev.error}`),
  el("p", {}, `prompt ${ev.n_prompt_tokens} tokens + max_tokens ${ev.max_tokens ?? "–"} > context window ${ev.n_ctx}. `
    + `Engine step counter: ${ev.step_counter} before, ${ev.step_counter_after} after: `,
  el("b", {}, `${ev.step_counter_after - ev.step_counter} engine steps`), " ran. The request was refused before any work.")));
}

export function determinismPanel(body, run) {
  const n = el("input", { type: "number", id: "det-n", value: 4, min: 1, max: 16, style: { width: "4em" } });
  const out = el("div", { id: "det-out" });
  clear(body, live("two real requests: alone, then batched with N others"),
    el("p", {}, el("button", { id: "btn-det", onclick: () => run(Number(n.value), out) }, "Run alone vs among N others"), " N = ", n),
    el("p", { class: "note" }, "Same prompt, same seed, your temperature (0 included). This server's batch-invariant kernels make the tokens "
      + "and logprobs identical; differences are outlined in red. Below, the same steps in a plain arithmetic show why other servers differ."),
    out);
}

export function renderDeterminism(node, r, temperature = null) {
  const rowOf = (v, other) => el("div", { class: "row" }, v.pieces.map((p, i) => tokenChip(p, {
    class: other.ids[i] !== p.id || other.logprobs[i] !== v.logprobs[i] ? "diff" : "",
    title: `logprob ${v.logprobs[i]}` })));
  clear(node, el("p", { id: "det-result", dataset: { sameIds: r.same_ids, sameLogprobs: r.same_logprobs } },
    temperature === null ? "" : `temperature ${temperature}${temperature === 0 ? " (greedy)" : ""}, seed as set: `,
    r.same_ids && r.same_logprobs ? el("span", { class: "ok" }, "identical tokens and logprobs, bit for bit")
      : el("span", { class: "err" }, `differs: ids ${r.same_ids ? "same" : "differ"}, logprobs ${r.same_logprobs ? "same" : "differ"}`)),
  el("b", {}, "alone"), rowOf(r.alone, r.loaded), el("b", {}, `among ${r.others} others`), rowOf(r.loaded, r.alone));
}

// Panel 11: the trigram model's generation and, for one step, the row of its count table it used.
export function renderTrigram(body, tri, selected, onSelect) {
  if (!tri) {
    clear(body, live("the trigram model's own lookup()"), el("p", { class: "note" },
      "Tick “+ trigram” and press Enter: a model trained by counting 45 sentences of an infrastructure chat runs through the same engine, on the same prompt (without a chat template), and predicts from the last two tokens only."));
    return;
  }
  const i = selected ?? tri.tokens.length - 1;
  const tok = tri.tokens[i];
  const lk = tok && tok.lookup;
  const pcs = (tok && tok.lookupPieces) || {};
  const pp = (id) => pcs[id] || { id, text: String(id), hex: "", special: false, bytes: false };
  let table = null;
  if (lk) {
    const rows = lk.seen ? lk.counts : [];
    table = el("div", { id: "trigram-lookup", dataset: { pair: JSON.stringify(lk.pair), seen: lk.seen, total: lk.total,
      counts: JSON.stringify(lk.counts), backoff: lk.backoff } },
    el("p", {}, "after the two tokens ", tokenChip(pp(lk.pair[0])), " ", tokenChip(pp(lk.pair[1])),
      lk.seen ? ` the corpus continues ${lk.total} time(s):` : " — never seen in the corpus: an empty row."),
    el("table", {}, el("tr", {}, el("th", {}, "next token"), el("th", {}, "count"), el("th", {}, "share")),
      rows.length ? rows.map(([t, c]) => el("tr", { class: t === tok.piece.id ? "chosen" : "" },
        el("td", {}, el("code", {}, visible(pp(t).text))), el("td", {}, c), el("td", {}, pct(c / lk.total))))
        : el("tr", {}, el("td", { colspan: 3 }, "(empty)"))),
    lk.seen ? null : el("p", { class: "note" }, `so it backs off to the ${lk.backoff} counts (${lk.backoff_total} in all): `
      + lk.backoff_counts.slice(0, 6).map(([t, c]) => `${visible(pp(t).text)}×${c}`).join(", ")));
  }
  clear(body, live("the trigram model's lookup(t-2, t-1) for each engine step"),
    el("div", { class: "row gen", id: "trigram-tokens", dataset: { ids: JSON.stringify(tri.tokens.map((t) => t.piece.id)) } },
      genChips(tri.tokens, { onPick: onSelect, mark: i })),
    tri.text || !tri.finish ? el("pre", {}, tri.text) : el("p", { class: "note", id: "trigram-no-text" },
      `no text: its first pick ends the reply (finish: ${tri.finish}); the toy knows only its corpus, so try a prompt like `
      + "“the deploy failed on the”."),
    table,
    el("p", { class: "note" }, "Two tokens cannot see the question: a real model reads the whole context through attention."));
}

// Panel 12: the request as an OpenAI-compatible call, and the engine's trace of it.
export function renderInspector(body, run) {
  if (!run) { clear(body, live("the request and its engine trace"), el("p", { class: "note" }, "Press Enter first.")); return; }
  const p = run.params;
  const common = { model: run.model, max_tokens: p.max_tokens, temperature: p.temperature, top_p: p.top_p, top_k: p.top_k,
    min_p: p.min_p, seed: p.seed, ...(p.stop ? { stop: p.stop } : {}), ...(p.ignore_eos ? { ignore_eos: true } : {}) };
  const chat = run.templateUsed;
  const req = chat ? { ...common, messages: [{ role: "user", content: run.promptText }], logprobs: true, top_logprobs: 5 }
    : { ...common, prompt: run.promptText, logprobs: 5 };
  const path = chat ? "/v1/chat/completions" : "/v1/completions";
  const json = JSON.stringify(req, null, 2);
  const curl = `curl ${location.origin}${path} -H 'Content-Type: application/json' -d '${JSON.stringify(req).replace(/'/g, "'\\''")}'`;
  const { model, messages, prompt, max_tokens, temperature, top_p, seed, stop, ...extra } = req;
  const args = [`model=${JSON.stringify(model)}`, chat ? `messages=${JSON.stringify(messages)}` : `prompt=${JSON.stringify(prompt)}`,
    `max_tokens=${max_tokens}`, `temperature=${temperature}`, `top_p=${top_p}`, `seed=${seed}`,
    ...(stop ? [`stop=${JSON.stringify(stop)}`] : []), `extra_body=${JSON.stringify(extra)}`];
  const py = `from openai import OpenAI\nclient = OpenAI(base_url="${location.origin}/v1", api_key="none")\n`
    + `r = client.${chat ? "chat.completions" : "completions"}.create(\n    ${args.join(",\n    ")},\n)\nprint(r)`;
  const trace = run.steps.map((s) => ({ step: s.step_id, kind: s.mine?.kind, start: s.mine?.start, n: s.mine?.num_tokens,
    sampled: s.mine?.sampled, batch: s.batch.length, ms: +(1000 * (s.t_end - s.t_start)).toFixed(2), blocks: s.block_table }));
  const copy = (text) => el("button", { onclick: () => navigator.clipboard && navigator.clipboard.writeText(text) }, "copy");
  clear(body, live("the request this page sent and the EngineEvents it produced"),
    el("p", {}, el("b", {}, `POST ${path}`), " ", copy(json)), el("pre", { id: "inspector-json" }, json),
    el("p", {}, el("b", {}, "curl"), " ", copy(curl)), el("pre", { id: "inspector-curl" }, curl),
    el("p", {}, el("b", {}, "Python (openai client)"), " ", copy(py)), el("pre", { id: "inspector-python" }, py),
    el("p", {}, el("b", {}, `engine trace (request ${run.rid}, ${trace.length} steps)`), " ", copy(JSON.stringify(trace))),
    el("pre", { id: "inspector-trace" }, trace.map((t) => JSON.stringify(t)).join("\n")));
}
