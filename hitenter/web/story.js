// Story mode: the journey of one prompt in the order the articles tell it, one step at a time. Each step
// is a short explanation plus the live panel(s) that show it; the panels are the dashboard's own sections,
// moved onto the stage while their step is shown and put back afterwards (so they stay live).
import { el, clear, visible } from "./util.js";

export const STEPS = [
  { key: "prompt", title: "You hit Enter", panels: [], custom: "prompt",
    text: "Your text goes to the engine as one request. With the chat template ticked it is first wrapped in the "
      + "conversation format the model was trained on: role markers and special tokens you never typed." },
  { key: "tokens", title: "Text becomes tokens", panels: ["p-tokens"],
    text: "The tokenizer cuts the text into pieces from a fixed vocabulary: common words are one piece, rare ones "
      + "several, and a leading space is part of the piece. The model only ever sees these pieces. Context limits, prices "
      + "and the KV cache are all counted in them: see characters and words per token under the chips." },
  { key: "ids", title: "Tokens become numbers", panels: [], custom: "ids",
    text: "Each piece is replaced by its number in the vocabulary. From here on the prompt is a short list of "
      + "integers; everything after this is arithmetic on them." },
  { key: "drill_words", title: "Drill: words to tokens", panels: ["p-drill-words"],
    text: "For English, tokens ≈ words ÷ 0.75: 3,000 words is about 4,000 tokens. Answer the question, then see how far "
      + "the rule is from the real tokenizer on your own text." },
  { key: "embeddings", title: "Numbers become vectors", panels: ["p-embed"],
    text: "Each id selects one row of a learned table: a vector of a few hundred numbers. Tokens used alike end up "
      + "with similar rows, which is why the nearest rows of a word are often its variants." },
  { key: "positions", title: "Where each token sits", panels: ["p-rope"],
    text: "A set of vectors has no order. Rotary position embedding turns each pair of numbers in a query and a key "
      + "by an angle that grows with the position, so their dot product depends on how far apart they are." },
  { key: "order", title: "Word order", panels: ["p-order"],
    text: "“The dog bites the man” and “the man bites the dog” are the same tokens, so the same embedding rows: one bag of "
      + "vectors. Only the positions tell them apart, and after the layers every moved word is another vector." },
  { key: "attention", title: "Tokens look at each other", panels: ["p-attn"],
    text: "In every layer each token scores all earlier tokens (query · key / √d), softmax turns the scores into "
      + "weights, and it takes the weighted mix of their values. This is how “bank” learns which bank you mean." },
  { key: "layers", title: "Layer after layer", panels: ["p-resid"],
    text: "A layer is attention followed by a small MLP, each adding its result onto a running vector (the residual "
      + "stream). Stacked dozens of times, the last token's vector becomes a description of what should come next." },
  { key: "logits", title: "One score per token", panels: ["p-logits"],
    text: "The final vector is compared with every row of the output table: one raw score, a logit, for every token "
      + "in the vocabulary. Higher means more likely, but these are not probabilities yet." },
  { key: "softmax", title: "Scores become probabilities", panels: ["p-logits"],
    text: "Softmax exponentiates each logit and divides by the sum, so the numbers are positive and add up to 1. "
      + "Moving the temperature here rescales the logits before that step." },
  { key: "drill_softmax", title: "Drill: softmax by hand", panels: ["p-drill-softmax"],
    text: "p_i = e^(z_i) / Σ_j e^(z_j), on three of the model's own logits. Then add the same number to all three: "
      + "nothing changes, because only the differences matter." },
  { key: "temperature", title: "Greedy and temperature", panels: ["p-dist"],
    text: "The sampler divides the logits by the temperature: below 1 the favourite gets more of the mass, above 1 "
      + "the tail gets more. Temperature 0 is greedy: no dice, the top token, one-hot. Drag the slider." },
  { key: "hot", title: "Break it: turn the temperature up", panels: ["p-break"], focus: "btn-temps",
    text: "The same prompt and seed at temperature 0.2, 1 and 2, side by side. Set it high enough and any model drifts "
      + "into nonsense: the long tail of unlikely tokens takes over." },
  { key: "top_k", title: "Top-k", panels: ["p-dist"],
    text: "Top-k keeps only the k most likely tokens and shares the probability among them; everything else is cut "
      + "(greyed rows). It removes the long tail of unlikely tokens in one stroke." },
  { key: "top_p", title: "Top-p", panels: ["p-dist"],
    text: "Top-p keeps the smallest set of best tokens whose probabilities add up to p. When the model is sure, that "
      + "is one or two tokens; when it hesitates, many. It cuts the tail without making the output deterministic." },
  { key: "draw", title: "The draw", panels: ["p-dice"],
    text: "Now the dice: with the request's own seed the sampler picks one token in proportion to what is left. "
      + "The same seed gives the same token, which is what Replay checks." },
  { key: "determinism", title: "Same seed, busy server", panels: ["p-determinism"],
    text: "On many servers even temperature 0 changes run to run, because the number of other requests in the batch "
      + "changes the arithmetic. Run the same request alone and among others and compare bit for bit." },
  { key: "loop", title: "The loop and the KV cache", panels: ["p-loop", "p-kv"],
    text: "The chosen token is appended and the model runs again for the next one: N tokens are N passes, one after "
      + "another. It does not redo the prompt: the keys and values of every earlier token were kept in the KV cache." },
  { key: "overrule", title: "Break it: overrule one token", panels: ["p-break", "p-branch"], focus: "btn-overrule",
    text: "Tokens are never revised: each is predicted from everything before it. Replace one token mid-answer and "
      + "everything after it changes, which is how one unlucky token can derail a long answer." },
  { key: "prefill", title: "Prefill, then decode", panels: ["p-timeline"],
    text: "The first step reads the whole prompt at once (prefill: many tokens, heavy arithmetic, the time to first "
      + "token). Each later step reads one new token (decode: light arithmetic, but all the weights are read again)." },
  { key: "stops", title: "When it stops", panels: ["p-stop"],
    text: "Generation ends on the model's end token, on a stop string you gave, or when max_tokens runs out. "
      + "Text that might be the start of a stop string is held back until it is decided." },
  { key: "no_eos", title: "Break it: ignore the end token", panels: ["p-break"], focus: "btn-ignore-eos",
    text: "“Say hi” stops after a few tokens on the model's end token. Take that away and greedy decoding runs on until "
      + "the max_tokens budget is spent, often in a loop." },
  { key: "overflow", title: "Break it: overflow the window", panels: ["p-break"], focus: "btn-overflow",
    text: "Prompt tokens plus max_tokens must fit the context window, or the request is refused before any work is done: "
      + "the engine's step counter does not move." },
  { key: "trigram", title: "What two tokens cannot do", panels: ["p-trigram"],
    text: "The same loop around a model that sees only the last two tokens: it runs, but cannot use the question. What "
      + "makes a model good is how much of the context its scores use, and attention uses all of it." },
  { key: "batching", title: "Many requests at once", panels: ["p-kv"],
    text: "A decode step reads all the weights to produce one token, so the server lets many requests share each "
      + "step: continuous batching. Send a burst and watch the requests join and leave the batch." },
  { key: "faster", title: "Making it faster", panels: ["p-fast"],
    text: "Batching, measured here; the bandwidth ceiling against real tokens/s; quantization as bytes to read; the KV "
      + "cache per token scaled to a 13B model and a 1M-token window; speculative decoding; prefill and decode apart." },
  { key: "images", title: "An image's way in", panels: ["p-vision"],
    text: "A model served with its vision projector takes pictures too. The image is resized to what the encoder expects, "
      + "cut into small square patches, run through a vision transformer, pooled or merged into a few hundred rows and "
      + "projected to the text model's width: those rows sit in the prompt where the image was, like token embeddings." },
  { key: "cheat", title: "Cheat sheet", panels: ["p-cheat"],
    text: "Everything on one page, with this model's and this run's numbers beside each rule." },
];

// The pipeline at a glance (drawn above every step, the current stage lit): which box each step is about.
const FLOW = [["text", ["prompt"]], ["tokenizer", ["tokens", "drill_words"]], ["ids", ["ids"]], ["embedding", ["embeddings"]],
  ["+ position", ["positions", "order"]], ["N × (attention + MLP)", ["attention", "layers"]], ["LM head", ["logits"]],
  ["softmax", ["softmax", "drill_softmax"]], ["sampler", ["temperature", "hot", "top_k", "top_p", "draw", "determinism"]],
  ["next token ↺", ["loop", "overrule", "prefill", "stops", "no_eos", "overflow", "trigram"]], ["batch", ["batching", "faster"]]];

function flow(key, go, layers) {
  return el("div", { class: "flow", id: "story-flow" }, FLOW.map(([name0, keys], i) => [
    i ? el("span", { class: "arrow" }, "→") : null,
    el("span", { class: `box ${keys.includes(key) ? "on" : ""}`, dataset: { keys: keys.join(" ") }, title: "go to this stage",
      onclick: () => go && go(keys[0]) }, layers ? name0.replace("N ×", `${layers} ×`) : name0)]));
}

function customBody(kind, S) {
  const run = S.run, tr = S.trace;
  if (kind === "prompt") {
    const text = document.getElementById("prompt").value;
    return el("div", { class: "bigprompt", id: "story-prompt" }, el("div", { class: "quote" }, text || "(empty)"),
      el("p", { class: "note" }, `${text.length} characters · chat template ${document.getElementById("chat").checked ? "on" : "off"}`
        + (run && run.prompt_ids ? ` · sent as ${run.prompt_ids.length} tokens` : "")));
  }
  const pieces = tr ? tr.pieces : run && run.pieces ? run.pieces : [];
  return el("div", { class: "ids", id: "story-ids", dataset: { ids: JSON.stringify(pieces.map((p) => p.id)) } },
    pieces.length ? pieces.map((p) => el("div", { class: "idcard" }, el("code", {}, p.special ? p.text : visible(p.text)), el("b", {}, p.id)))
      : el("p", { class: "note" }, "Press Enter first."));
}

// The same pipeline bar above the dashboard: it stays on screen, a click scrolls to the stage's panel, and the
// stage of the panel being read (the top-most one in view) is lit.
export function dashFlow(root, S) {
  const panelOf = (keys) => { const st = STEPS.find((x) => keys.includes(x.key) && x.panels.length); return st ? st.panels[0] : null; };
  const stageOf = new Map();
  FLOW.forEach(([, keys], i) => STEPS.filter((x) => keys.includes(x.key)).forEach((x) => x.panels.forEach((p) => {
    if (!stageOf.has(p)) stageOf.set(p, i);
  })));
  const draw = (lit) => clear(root, el("div", { class: "flow", id: "dash-flow-bar", dataset: { lit } }, FLOW.map(([name, keys], i) => [
    i ? el("span", { class: "arrow" }, "→") : null,
    el("span", { class: `box ${i === lit ? "on" : ""}`, dataset: { keys: keys.join(" ") }, title: "scroll to this stage",
      onclick: () => { const id = panelOf(keys); if (id) document.getElementById(id).scrollIntoView({ behavior: "smooth", block: "start" }); } },
    S.trace && S.trace.layers ? name.replace("N ×", `${S.trace.layers} ×`) : name)])));
  const seen = new Set();
  const io = new IntersectionObserver((entries) => {
    entries.forEach((e) => (e.isIntersecting ? seen.add(e.target.id) : seen.delete(e.target.id)));
    const top = [...document.querySelectorAll("main > section.panel")].find((sec) => seen.has(sec.id) && stageOf.has(sec.id));
    draw(top ? stageOf.get(top.id) : -1);
  }, { rootMargin: "-60px 0px -40% 0px" });
  document.querySelectorAll("main > section.panel").forEach((sec) => io.observe(sec));
  // the bar stays on top of the window: a panel scrolled to (from the bar or a link) keeps its heading below it
  new ResizeObserver(() => document.documentElement.style.setProperty("--flow-h", `${root.offsetHeight}px`)).observe(root);
  draw(-1);
  return { refresh: () => draw(Number(root.firstChild ? root.firstChild.dataset.lit : -1)) };
}

// Mount story mode into `root`; `onShow(step)` lets the page refresh a panel when its step is shown.
export function storyMode(root, S, onShow) {
  const homes = new Map();
  const rail = el("ol", { class: "rail", id: "story-rail" });
  const title = el("h2", { id: "story-title" });
  const text = el("p", { id: "story-text", class: "storytext" });
  const stage = el("div", { id: "story-panels" });
  const prev = el("button", { id: "story-prev", onclick: () => show(S.story - 1) }, "← back");
  const next = el("button", { id: "story-next", onclick: () => show(S.story + 1) }, "next →");
  const count = el("span", { class: "note", id: "story-count" });
  const flowSlot = el("div");
  clear(root, rail, el("div", { class: "stage" }, flowSlot, el("div", { class: "stagehead" }, title, el("div", {}, prev, count, next)),
    text, stage));
  STEPS.forEach((s, i) => rail.append(el("li", { dataset: { i, key: s.key }, onclick: () => show(i) }, el("span", {}, i + 1), s.title)));

  function putBack() {
    document.querySelectorAll("#p-break .breakit").forEach((g) => { g.hidden = false; });
    for (const [id, mark] of homes) mark.parentNode.insertBefore(document.getElementById(id), mark);
    homes.clear();
  }
  function show(i) {
    i = Math.max(0, Math.min(STEPS.length - 1, i));
    S.story = i;
    const s = STEPS[i];
    putBack();
    clear(stage);
    if (s.custom) stage.append(customBody(s.custom, S));
    for (const id of s.panels) {
      const sec = document.getElementById(id);
      const mark = document.createComment(id);
      sec.parentNode.insertBefore(mark, sec);
      homes.set(id, mark);
      stage.append(sec);
    }
    clear(flowSlot, flow(s.key, (k) => show(STEPS.findIndex((x) => x.key === k)), S.trace && S.trace.layers));
    title.textContent = `${i + 1} · ${s.title}`;
    text.textContent = s.text;
    root.dataset.step = s.key;
    root.dataset.index = i;
    count.textContent = ` ${i + 1} / ${STEPS.length} `;
    prev.disabled = i === 0;
    next.disabled = i === STEPS.length - 1;
    document.querySelectorAll(".sliders input").forEach((inp) => inp.classList.toggle("focus", inp.id === `slider-${s.key}`));
    document.querySelectorAll("#p-break button").forEach((b) => b.classList.toggle("focus", b.id === s.focus));
    // a break-it step shows its own experiment only (the dashboard shows them all)
    document.querySelectorAll("#p-break .breakit").forEach((g) => { g.hidden = Boolean(s.focus) && g.dataset.for !== s.focus; });
    rail.querySelectorAll("li").forEach((li, j) => { li.className = j === i ? "on" : j < i ? "done" : ""; });
    const on = rail.children[i];       // a one-line rail (phones): keep the current step in view
    if (rail.scrollWidth > rail.clientWidth) rail.scrollLeft = Math.max(0, on.offsetLeft - rail.offsetLeft - 40);
    onShow(s);
  }
  return { show, putBack, refresh: () => show(S.story ?? 0) };
}
