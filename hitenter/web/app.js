// The playground page: wires the prompt box to the engine's streams and redraws the panels.
// State lives in `S`; every panel is a pure function of it (see the panel modules).
import { getJSON, postJSON, streamPost, engineEvents } from "./api.js";
import { el, clear, visible, pct, live, sequencer } from "./util.js";
import { renderTokens } from "./tokens.js";
import { renderDistribution, renderSliders, reshape, renderDice } from "./dist.js";
import { renderLoop, renderBranch, renderStop } from "./loop.js";
import { renderTimeline } from "./timeline.js";
import { kvPanel, renderRequestKV, renderBlockMap } from "./kvmap.js";
import { breakPanel, renderRejected, renderV1Check, renderEosCompare, renderTemps, renderOverrule, windowNote, determinismPanel,
  renderDeterminism, renderTrigram, renderInspector } from "./extras.js";
import { newRun as makeRun, consume } from "./runs.js";
import { inside, traceNow, renderInside, markStale } from "./views.js";
import { renderFast } from "./fast.js";
import { renderCheat } from "./cheat.js";
import { renderDrills, countWords } from "./drills.js";
import { orderIdle } from "./order.js";
import { renderAnswer, dockWhenHidden } from "./answer.js";
import { renderArithmetic } from "./arithmetic.js";
import { watchScrollers } from "./scrollhint.js";
import { renderVision } from "./vision.js";

const $ = (id) => document.getElementById(id);
const body = (id) => $(id).querySelector(".body");
const S = { models: [], eng: { kv: null, steps: [], preempted: [] }, es: null, run: null, prev: null, branch: null,
  tri: null, triSel: null, abort: null, sel: null, sampling: { temperature: 0.8, top_k: -1, top_p: 1, min_p: 0 },
  trace: null, story: 0, fast: null, sliders: {}, measureCtl: { n: 8, measure: null }, draws: { visible: 0, full: 0 } };
window.playground = S;                       // for the curious (and the tests): the page's whole state

const model = () => $("model").value;
const info = () => S.models.find((m) => m.name === model());
function params(extra = {}) {
  const stop = $("stop").value;
  return { ...S.sampling, seed: Number($("seed").value), max_tokens: Number($("max_tokens").value),
    stop: stop ? [stop] : null, ignore_eos: $("ignore_eos").checked, ...extra };
}
const status = (text) => { $("status").textContent = text; };
const newRun = (name, mode, p, text) => makeRun(S.models, name, mode, p, text);
// Set a sampler slider from code: its value, its readout and the params, as if it had been dragged.
// The step whose distribution panels 2-3 show: the clicked one; else, in story mode, step 0 (the token right
// after the prompt, the one the logits steps show too: one pinned step); on the dashboard the latest.
function selIndex(run) {
  if (S.sel !== null && S.sel !== undefined) return S.sel;
  return document.body.dataset.view === "story" ? 0 : run.tokens.length - 1;
}
const pinNote = (run, i) => (S.sel === null || S.sel === undefined) && document.body.dataset.view === "story"
  ? " (pinned: the first token after your prompt, the same step the logits and softmax steps show)" : "";
const chatOn = () => $("chat").checked && !info().trigram;
// a thinking model's template switch (sent only where the model has one and the chat template is on)
const thinkOn = () => (chatOn() && info().thinks ? $("think").checked : undefined);

// Drawing is batched per animation frame: the panels on screen (the story's stage, or the dashboard panels in
// view) every frame; the others at most every FULL_MS and once when a request ends, so a streamed token
// costs the page a frame's work, not 22 panels.
const FULL_MS = 500;
let pending = false, lastFull = 0, fullTimer = null;
const onScreen = new Set();
const shown = (id) => (document.body.dataset.view === "story" ? Boolean($(id).closest("#story-panels")) : onScreen.has(id));
function render() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const wait = FULL_MS - (performance.now() - lastFull);
    if (wait <= 0) { draw(true); return; }
    draw(false);
    if (!fullTimer) fullTimer = setTimeout(() => { fullTimer = null; draw(true); }, wait);
  });
}

function draw(all) {
  if (all) lastFull = performance.now();
  S.draws[all ? "full" : "visible"] += 1;
  const on = (id) => all || shown(id);
  const run = S.run;
  renderAnswer($("answer"), $("answer-dock"), run, performance.now());
  if (on("p-tokens")) {
    if (run && run.prompt_ids) renderTokens(body("p-tokens"), { ...run, max_model_len: run.maxModelLen, template_used: run.templateUsed });
    else if (run && run.overflow && run.error && run.error.pieces) renderTokens(body("p-tokens"), { ...run.error,
      pieces: run.error.pieces.slice(0, 300), count: run.error.pieces.length, max_model_len: run.error.n_ctx });
  }
  if (run) {
    if (on("p-loop")) renderLoop(body("p-loop"), run, pick);
    if (on("p-stop")) renderStop(body("p-stop"), run, info().eog);
    if (on("p-timeline")) renderTimeline(body("p-timeline"), run);
    if (on("p-kv")) renderRequestKV(S.kvNodes.req, run);
    if (on("p-branch")) renderBranch(body("p-branch"), run, S.branch);
    if (on("p-inspector")) renderInspector(body("p-inspector"), run);
    const si = selIndex(run), tok = run.tokens[si];
    if (tok && tok.trace && !S.reshaped && on("p-dist")) {
      renderDistribution(S.distNode, { candidates: tok.trace.pieces, stages: tok.trace.stages, entropy: null },
        { chosen: tok.piece.id, step: si, greedy: tok.trace.draw && tok.trace.draw.method === "greedy",
          label: `step ${si}: as the engine sampled it${pinNote(run, si)}`, context: contextOf(run, si) });
    }
    if (tok && tok.trace && on("p-dice")) renderDice(body("p-dice").querySelector(".dice"), tok, si);
  }
  if (on("p-trigram")) renderTrigram(body("p-trigram"), S.tri, S.triSel, (i) => { S.triSel = i; render(); });
  if (on("p-kv")) renderBlockMap(S.kvNodes.map, S.eng, run && run.rid);
  const ran = run && run.error && S.prev && !S.prev.error && S.prev.model === run.model ? S.prev : run;   // a refusal ran nothing
  if (on("p-fast")) renderFast(body("p-fast"), S.fast, ran, S.eng, S.measured, S.measureCtl);
  if (on("p-cheat")) renderCheat(body("p-cheat"), S, info());
  $("window-note").textContent = windowNote(info());
  if (linkHover.on !== undefined && linkHover.on !== null) lightToken(linkHover.on);   // a redrawn panel keeps the hover
}

// Until the first token arrives the answer box counts the wait on the page's clock (said so); nothing else is drawn.
function tickWaiting(run) {
  const t = setInterval(() => {
    if (S.run !== run || run.tokens.length || run.finish || run.error || !S.abort) { clearInterval(t); return; }
    renderAnswer($("answer"), $("answer-dock"), run, performance.now());
  }, 100);
}

async function go(run, reqBody, { keep = false, path = "/generate" } = {}) {
  if (S.abort) S.abort.abort();
  const ctrl = new AbortController();
  S.abort = ctrl;
  if (!keep) { S.prev = S.run; S.run = run; S.sel = null; S.reshaped = false; S.branch = null; }
  run.bodies.push(reqBody);
  run.sentAt = performance.now();
  $("btn-pause").disabled = false;
  status("running…");
  tickWaiting(run);
  try {
    await streamPost(path, reqBody, (ev) => {
      consume(run, ev);
      if (ev.type === "error") renderRejected(S.breakOut, ev);
      else if (ev.type === "start") clear(S.breakOut);        // an old rejection does not outlive a good run
      render();
    }, ctrl.signal);
    status(run.error ? "rejected" : `done: ${run.finish || "paused"}`);
  } catch (e) {
    if (e.name !== "AbortError") {          // an HTTP refusal (a bad body): the run is rejected, not running
      run.error = { kind: "HTTP error", error: e.message };
      renderRejected(S.breakOut, { kind: "HTTP error", error: e.message, step_counter: "" });
      status(`rejected: ${e.message}`);
      render();
    }
  } finally {
    draw(true);                    // every panel current before the page says the request is over
    if (S.abort === ctrl) { S.abort = null; $("btn-pause").disabled = true; }
  }
}

// Enter: one request, timed alone. What the other panels need of the same prompt (its user tokens, the traced
// forward of the inside panels, the trigram toy's run, the sliders' re-shape) is asked for after it ends, one
// at a time, so that none of it shares the CPU with the request being timed.
async function start(p = params()) {
  const text = $("prompt").value, chat = $("chat").checked;
  const run = newRun(model(), "stream", p, text);
  S.modelName = run.model;
  if (info().trigram) { S.tri = run; S.triSel = null; }
  await go(run, { model: run.model, text, chat: chatOn(), think: thinkOn(), params: p });
  if (S.run !== run) return;
  await refineSelected();
  await userTokens(run);
  if (S.run !== run) return;
  await traceNow(S, { model: run.model, text, chat });
  await renderInside(S);
  if (linkHover.on !== undefined && linkHover.on !== null) lightToken(linkHover.on);
  const tri = S.models.find((m) => m.trigram);
  if ($("with_trigram").checked && tri && tri.name !== run.model && S.run === run) {
    const triRun = S.tri = newRun(tri.name, "stream", p, text);
    S.triSel = null;
    await streamPost("/generate", { model: tri.name, text, chat: false, params: p }, (ev) => { consume(triRun, ev); render(); })
      .catch((e) => status(`trigram: ${e.message}`));
  }
}

// Step mode: the Enter request itself (same prompt, seed and sliders as set now) with max_tokens = n for the
// n-th step, so its n-th draw is the very draw Enter makes (each request's generator is seeded once; a request
// per token with seed + i would draw differently). The prompt's KV comes from the prefix cache.
const samplingKey = (p) => JSON.stringify([p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.stop, p.ignore_eos]);
async function step() {
  let run = S.run;
  const p = params();
  if (!run || run.finish || run.error || run.model !== model() || run.promptText !== $("prompt").value || run.overflow) {
    run = newRun(model(), "step", p, $("prompt").value);
    S.prev = S.run; S.run = run; S.branch = null;
    userTokens(run);
  }
  const before = run.tokens.map((t) => t.piece.id);
  const changed = before.length > 0 && samplingKey(run.params) !== samplingKey(p);
  run.mode = "step";
  run.params = p;
  const n = Math.min(before.length + 1, p.max_tokens);
  const req = { model: run.model, text: run.promptText, chat: chatOn(), think: thinkOn(), params: { ...p, max_tokens: n } };
  S.sel = null; S.reshaped = false;
  await go(run, req, { keep: true });
  refineSelected();
  const same = before.every((id, i) => run.tokens[i] && run.tokens[i].piece.id === id);
  run.stepInfo = { n, seed: p.seed, same, changed };
  status(`step ${run.tokens.length}: the Enter request with max_tokens = ${n} (seed ${p.seed}): ${run.cached ?? 0} tokens from the prefix cache`
    + (same ? "" : "; the earlier tokens changed with the new settings"));
  render();
}

// A request of its own for a break-it (not the page's run): its events folded into a run object.
async function sideRun(text, p, chat) {
  const r = newRun(model(), "stream", p, text);
  try {
    await streamPost("/generate", { model: r.model, text, chat, params: p }, (ev) => consume(r, ev));
  } catch (e) { r.error = { kind: "HTTP error", error: e.message }; }
  return r;
}

// Break it: the end token. A prompt that ends quickly, greedy, with and without ignore_eos, side by side;
// the page's own controls are left as they were.
async function ignoreEos(out) {
  const text = "Say hi", chat = chatOn();
  const base = { ...params(), temperature: 0, max_tokens: 40, stop: null };
  clear(out, el("p", { class: "note" }, "running “Say hi” twice…"));
  const before = await sideRun(text, { ...base, ignore_eos: false }, chat);
  const after = await sideRun(text, { ...base, ignore_eos: true }, chat);
  renderEosCompare(out, before, after);
}

// Break it: temperature. The same prompt and seed at temperature 0.2, 1 and 2 (top-k/top-p off).
async function temps(out) {
  const text = $("prompt").value, chat = chatOn();
  clear(out, el("p", { class: "note" }, "running three continuations…"));
  const runs = await Promise.all([0.2, 1, 2].map((t) => sideRun(text,
    { ...params(), temperature: t, top_k: -1, top_p: 1, min_p: 0, max_tokens: 30, ignore_eos: false }, chat)));
  renderTemps(out, runs);
}

// Break it: overrule one token. The prompt greedy; halfway through, the model's token is replaced by its second
// choice and the engine continues from there (the prefix from the cache). Greedy, so the difference is the token's.
async function overrule(out) {
  const text = $("prompt").value, chat = chatOn();
  const base = { ...params(), temperature: 0, max_tokens: 24, stop: null, ignore_eos: false };
  clear(out, el("p", { class: "note" }, "running your prompt greedy…"));
  const before = await sideRun(text, base, chat);
  const at = Math.floor(before.tokens.length / 2);
  const tok = before.tokens[at];
  const alt = tok && tok.trace && tok.trace.pieces.find((p) => p.id !== tok.piece.id);
  if (before.error || before.tokens.length < 2 || !alt) {
    clear(out, el("p", { class: "err", id: "overrule-error" }, before.error ? `rejected: ${before.error.error}`
      : "the answer is too short to overrule a token in its middle: try a longer prompt or question"));
    return;
  }
  const after = newRun(before.model, "stream", base, text);
  Object.assign(after, { tokens: [...before.tokens.slice(0, at), { piece: alt, rid: null, trace: null }], text: "" });
  const ids = [...before.prompt_ids, ...after.tokens.map((t) => t.piece.id)];
  try {
    await streamPost("/generate", { model: before.model, prompt_ids: ids, params: { ...base, max_tokens: Math.max(1, base.max_tokens - at - 1) } },
      (ev) => consume(after, ev));
  } catch (e) { after.error = { kind: "HTTP error", error: e.message }; }
  after.text = piecesText(after.tokens.slice(0, at + 1)) + after.text;
  renderOverrule(out, before, after, at);
}

// The text of some tokens from their exact bytes (pieces carry them as hex); special tokens left out.
function piecesText(tokens) {
  const hex = tokens.filter((t) => !t.piece.special).map((t) => t.piece.hex).join("");
  return new TextDecoder().decode(new Uint8Array((hex.match(/../g) || []).map((h) => parseInt(h, 16))));
}

// The text just before step i: the end of the prompt (no special tokens) and the tokens generated before it.
function contextOf(run, i) {
  const before = [...(run.pieces || []).filter((p) => !p.special).map((p) => ({ piece: p })), ...run.tokens.slice(0, i)];
  const text = piecesText(before.slice(-14));
  return `…${text.replace(/\n/g, " ↵ ")}`;
}

// Making it faster: batch 1 against batch n, timed by the engine's own step timestamps.
async function measure(n) {
  S.measured = null;
  clear($("fast-measure"), el("span", { class: "note" }, `measuring: one request, then ${n} at once…`));
  try {
    S.measured = await postJSON("/measure", { model: model(), text: $("prompt").value, chat: chatOn(), n, tokens: 16 });
  } catch (e) { S.measured = { error: e.message }; }
  render();
}

// Making it faster: the prompt decoded with speculative decoding off, then on (the engine's step clock).
async function speculate(tokens) {
  const ctl = S.measureCtl;
  ctl.specTokens = tokens;
  ctl.spec = { running: true };
  render();
  const { temperature, seed, top_k, top_p, min_p } = params();
  try {
    ctl.spec = await postJSON("/speculative", { model: model(), text: $("prompt").value, chat: chatOn(), tokens, rounds: 2,
      params: { temperature, seed, top_k, top_p, min_p } });
  } catch (e) { ctl.spec = { error: e.message }; }
  try { S.fast = await getJSON(`/fast?model=${encodeURIComponent(model())}`); } catch (e) { /* the counters stay as they were */ }
  render();
}

// Break it: the context window. The server repeats the prompt's tokens until prompt + max_tokens is one more
// than this model's window, and sends it as a real request; then the same ids go to /v1/completions.
async function overflow() {
  const text = $("prompt").value, p = params();
  const run = newRun(model(), "stream", p, text);
  run.overflow = true;
  await go(run, { model: run.model, text, chat: chatOn(), params: p }, { path: "/overflow" });
  const ev = run.error;
  if (!ev || !ev.overflow) return;
  const r = await fetch("/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: run.model, prompt: ev.prompt_ids, max_tokens: ev.max_tokens }) });
  const j = await r.json().catch(() => null);
  renderV1Check(S.breakOut, r.status, j, ev);
  S.breakOut.append(el("p", { class: "note", id: "overflow-window", dataset: { nCtx: ev.n_ctx, trained: info().context_length } }, windowNote(info())));
}

// Characters per token of the user's own text (no template): its own /tokenize, without the chat template.
function userTokens(run) {
  return postJSON("/tokenize", { model: run.model, text: run.promptText, chat: false })
    .then((t) => { run.userTokens = { chars: run.promptText.length, tokens: t.count, words: countWords(run.promptText) }; render(); renderDrills(body("p-drill-words"), S); })
    .catch(() => {});
}

function pause() {
  if (S.abort) { S.abort.abort(); S.run.mode = "paused"; status("paused: Step continues one token at a time"); render(); }
}

async function replay() {
  const before = S.run;
  if (!before || !before.bodies.length) return;
  const run = newRun(before.model, before.mode, before.params, before.promptText);
  S.prev = S.run; S.run = run; S.sel = null; S.reshaped = false; S.branch = null;
  for (const b of before.bodies) await go(run, b, { keep: true });     // a Step run: its requests, in order
  const ids = (r) => JSON.stringify(r.tokens.map((t) => t.piece.id));
  const same = ids(before) === ids(run);
  clear(S.replayNode, el("p", { id: "replay", dataset: { match: same, seed: run.params.seed, requests: before.bodies.length } }, same
    ? el("span", { class: "ok" }, `replayed ${before.bodies.length} request(s) with seed ${run.params.seed}: identical ${run.tokens.length} token ids`)
    : el("span", { class: "err" }, "replay differs (was the seed changed, or the seed empty?)")));
}

// Click a generated token: show its step in panels 2/3 and offer the other candidates (branching).
function pick(i, event) {
  S.sel = i; S.reshaped = false;
  refineSelected();
  render();
  const run = S.run, tok = run.tokens[i];
  document.querySelectorAll(".menu").forEach((m) => m.remove());
  if (!tok.trace) return;
  const menu = el("div", { class: "menu", id: "branch-menu", style: { left: `${event.pageX}px`, top: `${event.pageY + 12}px` } },
    el("div", { class: "note" }, "continue with:"),
    tok.trace.pieces.slice(0, 12).map((p, j) => el("button", { dataset: { id: p.id }, disabled: p.id === tok.piece.id,
      onclick: () => { menu.remove(); branch(i, p); } }, `${visible(p.text)}  ${pct(tok.trace.stages[0].probs[j])}`)));
  document.body.append(menu);
  setTimeout(() => document.addEventListener("click", () => menu.remove(), { once: true }), 0);
}

async function branch(i, alt) {
  const run = S.run;
  const ids = [...run.prompt_ids, ...run.tokens.slice(0, i).map((t) => t.piece.id), alt.id];
  const br = { at: i, prefixLen: ids.length, tokens: [{ piece: alt, rid: null, trace: null }], cached: null };
  S.branch = br;
  const sub = newRun(run.model, "stream", run.params, run.promptText);
  sub.tokens = br.tokens;
  render();
  await streamPost("/generate", { model: run.model, prompt_ids: ids,
    params: { ...run.params, max_tokens: Math.max(1, run.params.max_tokens - i - 1) } }, (ev) => {
    consume(sub, ev);
    if (ev.type === "output") br.cached = ev.num_cached_tokens;
    render();
  });
}

// The sliders re-shape the selected step's cached logits (no model run) and set the next request's params.
// Every move sends a request; only the answer to the latest one is drawn (answers can arrive out of order).
const latestReshape = sequencer();
async function refineSelected() {
  const run = S.run;
  const si = run ? selIndex(run) : 0;
  const tok = run && run.tokens[si];
  if (!tok || !tok.rid) return;
  const sent = { ...S.sampling };
  try {
    const d = await latestReshape(() => reshape(run.model, tok, sent));
    if (!d) return;
    S.reshaped = true;
    renderDistribution(S.distNode, d, { chosen: tok.piece.id, reshaped: true, params: sent, step: si, greedy: d.greedy,
      context: contextOf(run, si),
      label: `step ${si}${pinNote(run, si)} re-shaped with temperature ${sent.temperature}, top_k ${sent.top_k}, `
        + `top_p ${sent.top_p}, min_p ${sent.min_p}${d.greedy ? " (temperature 0 is greedy: the filters are skipped, argmax wins)" : ""}` });
  } catch (e) { status(e.message); }
}

async function preview() {
  const r = S.run;
  if (S.abort || !model() || (r && r.prompt_ids && r.model === model() && r.promptText === $("prompt").value)) return;
  try {
    const t = await postJSON("/tokenize", { model: model(), text: $("prompt").value, chat: $("chat").checked, think: thinkOn() });
    if (S.abort) return;
    const u = $("chat").checked && t.template_used ? await postJSON("/tokenize", { model: model(), text: $("prompt").value, chat: false }) : t;
    if (!S.abort) renderTokens(body("p-tokens"), { ...t, userTokens: { chars: $("prompt").value.length, tokens: u.count,
      words: countWords($("prompt").value) } }, { preview: true });
  } catch (e) { status(e.message); }
}

function connect() {
  if (S.es) S.es.close();
  S.eng = { kv: null, steps: [], preempted: [] };
  S.es = engineEvents(model(), (ev) => {
    S.eng.kv = ev.kv;
    if (ev.type === "step") { S.eng.steps.push(ev); S.eng.steps = S.eng.steps.slice(-200); S.eng.preempted.push(...ev.preempted); }
    render();
  });
}

// One token hovered anywhere in the traced panels lights the same position everywhere: its chip in every row
// (embedding, attention, lens), its attention row label, its prompt chip in panel 1 and its KV block in panel 7.
function linkHover(e) {
  const t = e.target.closest(".tracetoks .tok[data-index], #attn-heat .qlab[data-q]");
  const i = t ? (t.dataset.index ?? t.dataset.q) : null;
  if (i === linkHover.on) return;
  linkHover.on = i;
  lightToken(i);
}

// Light position `i` (null: none) in every view of it. Called again after each redraw, since a panel drawn
// anew while the pointer rests on a token would otherwise lose its light.
function lightToken(i) {
  document.querySelectorAll(".hl").forEach((n) => n.classList.remove("hl"));
  if (i === null || i === undefined) return;
  document.querySelectorAll(`.tracetoks .tok[data-index="${i}"], #attn-heat .qlab[data-q="${i}"]`).forEach((n) => n.classList.add("hl"));
  const at = Number(i) + ((S.trace && S.trace.offset) || 0);      // a long prompt's trace starts at its offset
  const chip = document.querySelectorAll("#prompt-tokens .tok")[at];
  if (chip) chip.classList.add("hl");
  const run = S.run;                     // its KV slot: the block of this request that holds that position
  const blk = run && run.blockSize ? document.querySelectorAll("#req-blocks .reqblk")[Math.floor(at / run.blockSize)] : null;
  if (blk) blk.classList.add("hl");
}

async function init() {
  S.models = await getJSON("/models");
  clear($("model"), S.models.map((m) => el("option", { value: m.name }, `${m.name} (${m.architecture}, ${m.vocab_size} tokens)`)));
  const distBody = body("p-dist");
  const sliders = el("div", { class: "sliders" });
  S.distNode = el("div", { id: "dist" });
  clear(distBody, sliders, S.distNode);
  S.sliders = renderSliders(sliders, S.sampling, () => refineSelected());
  const dice = el("div", { class: "dice" });
  S.replayNode = el("div");
  clear(body("p-dice"), dice, S.replayNode);
  renderDice(dice, null);
  S.kvNodes = kvPanel(body("p-kv"), (n) => postJSON("/burst", { model: model(), n,
    text: $("prompt").value, chat: $("chat").checked, max_tokens: Number($("max_tokens").value) }));
  S.breakOut = breakPanel(body("p-break"), { ignoreEos, overflow, temps, overrule });
  S.measureCtl.measure = measure;
  S.measureCtl.speculate = speculate;
  orderIdle(body("p-order"), model);
  renderVision(body("p-vision"), info(), model);
  determinismPanel(body("p-determinism"), async (n, out) => {
    const T = S.sampling.temperature, req = { model: model(), text: $("prompt").value, chat: $("chat").checked };
    clear(out, el("p", { class: "note" }, `running at your temperature ${T}${T === 0 ? " (greedy)" : ""}…`));
    try {
      const r = await postJSON("/determinism", { ...req, params: { ...params(), temperature: T }, others: n });
      const arith = el("div", { id: "det-arith-out" }, el("p", { class: "note" }, "comparing the arithmetic…"));
      renderDeterminism(out, r, T);
      out.append(arith);
      const pieces = new Map(r.alone.pieces.map((p) => [p.id, p.text]));
      const a = await postJSON("/determinism/arithmetic", { ...req, answer: r.alone.ids.slice(0, 16), others: n });
      renderArithmetic(arith, a, (id) => pieces.get(id) ?? String(id));
    } catch (e) { clear(out, el("p", { class: "err", id: "det-error" }, e.message)); }
  });
  ["p-loop", "p-branch", "p-timeline", "p-stop", "p-inspector"].forEach((id) => clear(body(id), live("waiting for a request"),
    el("p", { class: "note" }, "Press Enter.")));
  renderTrigram(body("p-trigram"), null);
  $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); start(); });
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); start(); } });
  let timer = null;
  $("prompt").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { preview(); renderDrills(body("p-drill-words"), S); }, 250);
    markStale(S, "the prompt changed"); });
  $("chat").addEventListener("change", () => { preview(); markStale(S, "the chat template setting changed"); });
  const thinkSwitch = () => { $("think-wrap").hidden = !info().thinks; };
  thinkSwitch();
  $("model").addEventListener("change", thinkSwitch);
  $("think").addEventListener("change", () => { preview(); markStale(S, "the thinking switch changed"); });
  $("model").addEventListener("change", () => { connect(); preview(); markStale(S, "the model changed"); renderVision(body("p-vision"), info(), model);
    S.measured = null; S.measureCtl.spec = null; orderIdle(body("p-order"), model, "the model changed: compare again on this one"); renderDrills(null, S);
    getJSON(`/fast?model=${encodeURIComponent(model())}`).then((f) => { S.fast = f; render(); }); });
  $("btn-step").addEventListener("click", step);
  $("btn-pause").addEventListener("click", pause);
  $("btn-replay").addEventListener("click", replay);
  document.addEventListener("mouseover", linkHover);
  const io = new IntersectionObserver((entries) => {
    entries.forEach((e) => (e.isIntersecting ? onScreen.add(e.target.id) : onScreen.delete(e.target.id)));
    render();
  });
  document.querySelectorAll("main > section.panel").forEach((sec) => io.observe(sec));
  dockWhenHidden($("answer"), $("answer-dock"));
  connect();
  inside(S, { $, body, render, reselect: () => { S.reshaped = false; render(); refineSelected(); } });
  getJSON(`/fast?model=${encodeURIComponent(model())}`).then((f) => { S.fast = f; render(); }).catch((e) => status(e.message));
  await preview();
  watchScrollers(document.body);       // a table wider than its panel says it scrolls
  document.body.dataset.ready = "true";
}

init().catch((e) => status(`failed to start: ${e.message}`));
