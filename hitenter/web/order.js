// Panel 20: word order against positions. "the dog bites the man" and "the man bites the dog" are the same
// embedding rows (the same bag of vectors); only positions tell them apart, and after the layers each word's
// vector and the model's next-token guess differ. From POST /playground/api/trace/order.
import { el, clear, visible, pct, live, tokenChip } from "./util.js";
import { postJSON } from "./api.js";

const lab = (p) => (p.special ? p.text : visible(p.text));

export async function renderOrder(body, model, a = null, b = null) {
  body.dataset.model = model;
  const ia = el("input", { type: "text", id: "order-a", value: a || "the dog bites the man", size: 24 });
  const ib = el("input", { type: "text", id: "order-b", value: b || "the man bites the dog", size: 24 });
  const out = el("div", { id: "order-out" }, el("p", { class: "note" }, "tracing both…"));
  clear(body, live("two traced forwards of the engine's model (hitenter/models/trace.py)"),
    el("p", {}, ia, " vs ", ib, " ", el("button", { id: "btn-order", onclick: () => renderOrder(body, model, ia.value, ib.value) }, "compare")),
    out);
  let r;
  try {
    r = await postJSON("/trace/order", { model, a: ia.value, b: ib.value });
  } catch (e) {
    clear(out, el("p", { class: "note", id: "order-error" }, `this model cannot run the comparison: ${e.message}`));
    return;
  }
  const L = r.bag_cos.length - 1;
  const side = (s, name) => el("div", {}, el("b", {}, name), el("div", { class: "row" }, s.pieces.map((p, i) => tokenChip(p, { title: `position ${i}` }))),
    el("p", { class: "note" }, "next token: " + s.next.slice(0, 3).map((x) => `“${lab(x.piece)}” ${pct(x.p)}`).join(", ")));
  clear(out, el("div", { id: "order", dataset: { sameBag: r.same_bag, bagFirst: r.bag_cos[0], bagLast: r.bag_cos[L],
    nextA: r.a.next[0].piece.id, nextB: r.b.next[0].piece.id } },
  el("div", { class: "side" }, side(r.a, "sentence A"), side(r.b, "sentence B")),
  el("p", {}, r.same_bag ? el("b", {}, "The same tokens, so the same embedding rows: ") : "Not the same tokens: ",
    `the mean of the two sentences' embeddings has cosine ${r.bag_cos[0].toFixed(3)}. Without positions a transformer would see one bag `
    + `of vectors and could not tell them apart. With RoPE turning queries and keys by position, the mean after the last layer has cosine `,
    el("b", {}, r.bag_cos[L].toFixed(3)), "."),
  el("table", { id: "order-pairs" }, el("tr", {}, el("th", {}, "word"), el("th", {}, "position A → B"), el("th", {}, "same row (embedding)"),
    el("th", {}, `after layer ${L}`)),
  r.pairs.map((x) => el("tr", { dataset: { first: x.cos[0], last: x.cos[L] } }, el("td", {}, el("code", {}, lab(x.piece))),
    el("td", {}, `${x.a} → ${x.b}`), el("td", { class: "num" }, x.cos[0].toFixed(3)), el("td", { class: "num" }, x.cos[L].toFixed(3))))),
  el("p", { class: "note" }, "cosine of the same word's vector in the two sentences. A word at the same place with the same words "
    + "before it keeps cosine 1 (a token only sees the past); moved, it becomes another vector.")));
}

// Before a comparison (and after a model change): the sentences and the button only.
export function orderIdle(body, model, note = "") {
  clear(body, live("two traced forwards of the engine's model (hitenter/models/trace.py)"),
    el("p", {}, el("button", { id: "btn-order", onclick: () => renderOrder(body, model()) }, "Compare word order"),
      " “the dog bites the man” vs “the man bites the dog”: the same words, the same embedding rows, another order."),
    note ? el("p", { class: "note", id: "order-idle" }, note) : null);
  body.dataset.model = "";
}
