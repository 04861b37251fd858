// The two views (story mode and the free-form dashboard) and the traced forward behind the
// "inside the model" panels: one POST /trace per Enter, then each panel asks for its slice.
import { el, clear, live } from "./util.js";
import { postJSON } from "./api.js";
import { renderEmbedding, renderRope } from "./inside.js";
import { renderAttention, renderCompare, BANK_PAIR } from "./attention.js";
import { renderResidual, renderLogits } from "./residual.js";
import { storyMode, dashFlow } from "./story.js";
import { renderDrills } from "./drills.js";
import { renderOrder } from "./order.js";

const INSIDE = ["p-embed", "p-rope", "p-attn", "p-resid", "p-logits", "p-drill-softmax"];
let H = null;          // the page's helpers: $, body, render
let story = null;
let bar = null;
const node = (id) => (id === "p-attn" ? H.body(id).querySelector(".attn") : H.body(id));

// Trace the prompt on the engine's model (outside its scheduler). Sets S.trace, or S.traceError.
export async function traceNow(S, req) {
  const mine = (S.traceSeq = (S.traceSeq || 0) + 1);
  Object.assign(S, { tracedText: req.text, tracedModel: req.model });
  try {
    const tr = await postJSON("/trace", { ...req, last: true });     // a long prompt: its last tokens, said so
    if (mine !== S.traceSeq) return;
    Object.assign(S, { trace: tr, traceError: null, embSel: null, lensSel: null, attn: null });
  } catch (e) {
    if (mine !== S.traceSeq) return;
    Object.assign(S, { trace: null, traceError: reason(e.message) });
  }
}

// The server's reason in an error "PATH: STATUS {json}" (its error.message or detail), never the raw JSON.
function reason(msg) {
  const at = msg.indexOf("{");
  try {
    const j = JSON.parse(msg.slice(at));
    return (j.error && j.error.message) || j.detail || msg;
  } catch (e) { return at > 0 ? msg.slice(0, at).trim() : msg; }
}

// A prompt longer than a trace holds: each inside panel says which tokens it shows (the last ones, traced as a
// prompt of their own, so they do not see the tokens before them).
function traceWindow(S) {
  const tr = S.trace, cut = tr ? tr.offset || 0 : 0;
  for (const id of INSIDE) {
    const sec = H.$(id);
    let b = sec.querySelector(".trace-window");
    if (!cut) { if (b) b.remove(); continue; }
    if (!b) { b = el("p", { class: "note trace-window" }); sec.querySelector("h2").after(b); }
    const n = tr.pieces.length - tr.generated.length;
    Object.assign(b.dataset, { offset: cut, traced: n, total: tr.num_prompt_total });
    b.textContent = `A long prompt: this panel traces its last ${n} tokens (positions ${cut}–${cut + n - 1} of `
      + `${tr.num_prompt_total}; a trace holds at most ${n + tr.generated.length}), run as a prompt of their own: the ${cut} `
      + "tokens before them are not seen here. Positions below count from the first traced token.";
  }
}

function traceMissing(S) {
  renderDrills(H.body("p-drill-words"), S);
  for (const id of INSIDE.filter((x) => x !== "p-drill-softmax")) {
    clear(node(id), live("a traced forward of the engine's model"), el("p", { class: "note trace-missing" },
      S.traceError ? `no trace: ${S.traceError}` : "Press Enter to trace the prompt."));
  }
}

// After a prompt, template or model change the traced panels describe another input: mark them (a banner
// and data-stale on each section) until the next Enter traces the new one.
export function markStale(S, why) {
  if (!H || (!S.trace && !S.traceError)) return;
  for (const id of INSIDE) {
    const sec = H.$(id);
    sec.dataset.stale = "true";
    let b = sec.querySelector(".stale");
    if (!b) { b = el("p", { class: "stale" }); sec.querySelector("h2").after(b); }
    b.textContent = `${why}: this panel still shows the trace of “${(S.tracedText ?? "").slice(0, 40)}”${S.tracedModel ? ` on ${S.tracedModel}` : ""}. Press Enter to trace the new one.`;
  }
}

function unmarkStale() {
  for (const id of INSIDE) {
    const sec = H.$(id);
    delete sec.dataset.stale;
    sec.querySelectorAll(".stale").forEach((b) => b.remove());
  }
}

export async function renderInside(S) {
  if (!H) return;
  unmarkStale();
  document.body.dataset.traced = S.trace ? S.trace.trace_id : "";
  traceWindow(S);
  if (!S.trace) { traceMissing(S); return; }
  const jobs = [renderEmbedding(node("p-embed"), S), renderRope(node("p-rope"), S),
    renderAttention(node("p-attn"), S), renderResidual(node("p-resid"), S), renderLogits(node("p-logits"), S),
    Promise.resolve().then(() => renderDrills(H.body("p-drill-words"), S))];
  await Promise.all(jobs.map((j) => j.catch((e) => console.warn(e))));
  if (bar) bar.refresh();                 // the diagram names this model's layer count
  document.body.dataset.insideReady = S.trace.trace_id;
  if (story && document.body.dataset.view === "story") story.refresh();    // never pull panels off the dashboard
}

function setView(view) {
  document.body.dataset.view = view;
  H.$("story").hidden = view !== "story";
  H.$("dash-flow").hidden = view !== "dashboard";
  if (bar) bar.refresh();
  H.$("view-story").classList.toggle("on", view === "story");
  H.$("view-dash").classList.toggle("on", view === "dashboard");
  if (view === "story") story.refresh();
  else story.putBack();
  if (H.reselect) H.reselect(); else H.render();
}

export function inside(S, helpers) {
  H = helpers;
  const attnBody = H.body("p-attn");
  const compareOut = el("div", { id: "compare-out" });
  const pa = el("input", { id: "compare-a", value: BANK_PAIR[0], size: 30 }), pb = el("input", { id: "compare-b", value: BANK_PAIR[1], size: 30 });
  const word = el("input", { id: "compare-word", value: "bank", size: 6 });
  clear(attnBody, el("div", { class: "attn" }), el("p", { class: "controls" },
    el("button", { id: "btn-compare", onclick: () => renderCompare(compareOut, S.modelName || H.$("model").value, pa.value, pb.value, word.value) },
      "Compare the word"), word, "in", pa, "and", pb), compareOut);
  traceMissing(S);
  bar = dashFlow(H.$("dash-flow"), S);
  story = storyMode(H.$("story"), S, (step) => {
    H.render();
    const order = H.body("p-order"), m = H.$("model").value;
    if (step.key === "order" && order.dataset.model !== m) renderOrder(order, m);
    if (step.key.startsWith("drill")) renderDrills(null, S);
  });
  H.$("view-story").addEventListener("click", () => setView("story"));
  H.$("view-dash").addEventListener("click", () => setView("dashboard"));
  document.addEventListener("keydown", (e) => {
    if (document.body.dataset.view !== "story" || e.target.closest("textarea, input, select")) return;
    if (e.key === "ArrowRight") story.show(S.story + 1);
    if (e.key === "ArrowLeft") story.show(S.story - 1);
  });
  setView("story");
}
