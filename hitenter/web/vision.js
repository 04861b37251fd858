// Images (panel 23): one image's path through the served model, from POST /image on the engine's own vision
// encoder: the pixels as the encoder sees them with its patch grid, patches -> encoder -> merged / pooled
// token rows, each projected row's norm, where the image's rows sit in the prompt, and where the answer's
// tokens look on the image (a traced forward holding the image's rows). Without a projector: how to get one.
import { el, clear, live, tokenChip, seqColour, sequencer } from "./util.js";
import { postJSON } from "./api.js";

const visionSeq = sequencer();
let shown = 0;                     // renders so far: the panel's data-vision-ready marker

function ready(node, state) {          // marked on the panel's section (the test's ready marker)
  const at = node.closest("section") || node;
  shown += 1;
  at.dataset.visionState = state;
  at.dataset.visionReady = String(shown);
}

// The panel for a model: the image input, or (no projector) how to get one. `modelInfo` from GET /models.
export function renderVision(node, modelInfo, model) {
  if (!modelInfo || !modelInfo.vision) {
    clear(node, el("h3", {}, "Images"),
      el("p", { id: "vision-none", class: "note" }, `The model ${modelInfo ? modelInfo.name : ""} has no vision projector loaded, `
        + "so it cannot take images. Start the server with the model's projector file, ",
      el("code", {}, "hitenter serve model.gguf --mmproj mmproj.gguf"),
      " (llama.cpp's mmproj GGUF for that model; an mmproj*.gguf beside the model is found by itself), then this panel "
        + "shows the image's way in: pixels, patches, the encoder, the projected rows and their place in the prompt."));
    ready(node, "none");
    return;
  }
  const out = el("div", { id: "vision-out" }, el("p", { class: "note" }, "Pick or drop an image."));
  const text = el("input", { id: "vision-text", type: "text", value: "What is in this picture?", size: 30 });
  const send = (file) => {
    if (!file) return;
    const reader = new FileReader();
    reader.onload = () => run(out, model(), String(reader.result), text.value, node);
    reader.readAsDataURL(file);
  };
  const input = el("input", { id: "vision-file", type: "file", accept: "image/png,image/jpeg,image/webp,image/gif,image/bmp",
    onchange: () => send(input.files[0]) });
  const drop = el("div", { id: "vision-drop", class: "dropzone",
    ondragover: (e) => { e.preventDefault(); drop.classList.add("over"); },
    ondragleave: () => drop.classList.remove("over"),
    ondrop: (e) => { e.preventDefault(); drop.classList.remove("over"); send(e.dataTransfer.files[0]); } },
  "drop an image here, or ", input);
  clear(node, el("h3", {}, "Images: pixels → patches → encoder → tokens"),
    live("the engine's vision encoder: prepare + encode, image_prompt layout, a traced forward (POST /image)"),
    el("div", { class: "controls" }, drop, el("label", {}, "question ", text)), out);
  ready(node, "idle");
}

async function run(out, model, dataUrl, text, node) {
  clear(out, el("p", { class: "note" }, "encoding…"));
  let r;
  try {
    r = await visionSeq(() => postJSON("/image", { model, image: dataUrl, text, generate: 4 }));
  } catch (e) {
    clear(out, el("p", { class: "err", id: "vision-error" }, e.message));
    ready(node, "error");
    return;
  }
  if (!r) return;
  const view = { g: 0, layer: -1 };
  const canvas = el("canvas", { id: "vision-canvas", width: 256, height: Math.round(256 * r.size[0] / r.size[1]) });
  const img = new Image();
  const redraw = () => draw(canvas, img, r, view);
  img.onload = redraw;
  img.src = r.seen;
  clear(out,
    el("div", { class: "vision-row" }, canvas, el("div", {},
      el("p", { id: "vision-counts", dataset: { patches: r.patches, tokens: r.tokens, start: r.run.start, length: r.run.length,
        count: r.count, grid: r.patch_grid.join("x"), tokenGrid: r.token_grid.join("x") } },
      `${r.size[1]} × ${r.size[0]} pixels as the encoder sees them → ${r.patch_grid[0]} × ${r.patch_grid[1]} = `,
      el("b", {}, `${r.patches} patches`), ` of ${r.patch}×${r.patch} px → the ${r.projector} encoder (${r.encoder_layers} layers, `
        + `width ${r.encoder_width}) → ${r.reduce} ${r.merge}×${r.merge} → `, el("b", {}, `${r.tokens} tokens`),
      `, each projected to a ${r.width}-number row the text model takes in place of a token embedding.`),
      el("p", { class: "note" }, "thin lines: patches; thick lines: the token rows they become."))),
    el("h4", {}, "the projected rows' norms"), normStrip(r.norms),
    el("h4", {}, `where the image sits in the prompt: rows ${r.run.start}–${r.run.start + r.run.length - 1} of ${r.count}`
      + (r.bidirectional ? " (attended both ways among themselves)" : "")),
    seqStrip(r),
    attentionControls(r, view, redraw));
  ready(node, r.attention ? "attention" : "encoded");
}

function normStrip(norms) {
  const hi = Math.max(...norms, 1e-9), lo = Math.min(...norms);
  return el("div", { class: "vstrip", id: "vision-norms", dataset: { n: norms.length } },
    norms.map((v, i) => el("i", { style: { background: seqColour((v - lo) / Math.max(hi - lo, 1e-9)) }, title: `row ${i}: ${v.toFixed(3)}` })));
}

function seqStrip(r) {
  const chips = [];
  r.sequence.forEach((p, i) => {
    if (p) chips.push(tokenChip(p, { dataset: { pos: i } }));
    else if (i === r.run.start) {
      chips.push(el("span", { class: "tok imagerun", id: "vision-run", dataset: { start: r.run.start, length: r.run.length },
        title: `${r.run.length} image rows` }, el("span", { class: "piece" }, `image × ${r.run.length}`), el("span", { class: "tid" }, `${i}…`)));
    }
  });
  return el("div", { class: "tokens", id: "vision-seq" }, chips);
}

function attentionControls(r, view, redraw) {
  if (!r.attention) return el("p", { class: "note", id: "vision-attn-note" }, r.attention_note || "no answer traced");
  const layers = r.attention[0].layers.length;
  const label = el("span", { id: "vision-layer-label" }, "all layers (mean)");
  const slider = el("input", { type: "range", id: "vision-layer", min: -1, max: layers - 1, value: -1,
    oninput: () => { view.layer = Number(slider.value); label.textContent = view.layer < 0 ? "all layers (mean)" : `layer ${view.layer + 1} of ${layers}`;
      share(); redraw(); } });
  const note = el("p", { class: "note", id: "vision-share" });
  const share = () => {
    const a = r.attention[view.g];
    const s = view.layer < 0 ? a.share.reduce((x, y) => x + y, 0) / a.share.length : a.share[view.layer];
    note.textContent = `“${a.piece.text}” (chosen at row ${a.query}): ${(100 * s).toFixed(1)}% of its attention goes to the image's rows`;
    note.dataset.share = s;
  };
  const toks = r.attention.map((a, g) => tokenChip(a.piece, { dataset: { g }, class: g === 0 ? "chosen-branch" : "",
    onclick: (e) => { view.g = g; toks.forEach((t) => t.classList.remove("chosen-branch")); e.currentTarget.classList.add("chosen-branch"); share(); redraw(); } }));
  share();
  return el("div", { id: "vision-attn" }, el("h4", {}, "where the answer looks on the image (heads' mean, a traced forward with the image's rows)"),
    el("div", { class: "tokens gen", id: "vision-answer" }, toks), el("label", {}, label, slider), note);
}

function weights(r, view) {
  const a = r.attention && r.attention[view.g];
  if (!a) return null;
  if (view.layer >= 0) return a.layers[view.layer];
  return a.layers[0].map((_, k) => a.layers.reduce((s, row) => s + row[k], 0) / a.layers.length);
}

function draw(canvas, img, r, view) {
  const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height;
  ctx.drawImage(img, 0, 0, W, H);
  const [tr, tc] = r.token_grid, w = weights(r, view);
  if (w) {
    const cell = new Array(tr * tc).fill(0);
    r.cells.forEach((c, k) => { if (c !== null) cell[c] = w[k]; });
    const hi = Math.max(...cell, 1e-9);
    cell.forEach((v, c) => {
      ctx.fillStyle = `rgba(230, 40, 20, ${(0.75 * v) / hi})`;
      ctx.fillRect((c % tc) * W / tc, Math.floor(c / tc) * H / tr, W / tc, H / tr);
    });
  }
  const lines = (rows, cols, width, colour) => {
    ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.beginPath();
    for (let i = 1; i < rows; i++) { ctx.moveTo(0, (i * H) / rows); ctx.lineTo(W, (i * H) / rows); }
    for (let j = 1; j < cols; j++) { ctx.moveTo((j * W) / cols, 0); ctx.lineTo((j * W) / cols, H); }
    ctx.stroke();
  };
  if (r.patch_grid[1] <= W / 2) lines(r.patch_grid[0], r.patch_grid[1], 0.5, "rgba(255,255,255,0.45)");
  lines(tr, tc, 1.5, "rgba(255,255,255,0.9)");
  canvas.dataset.drawn = `${view.g}:${view.layer}`;
}
