// Panel 1: the exact token ids the engine prefills (chat template and special tokens included).
import { el, clear, tokenChip, live } from "./util.js";

// `src` is either the engine's `start` event (prompt_ids + pieces) or a /tokenize preview.
export function renderTokens(body, src, { preview = false } = {}) {
  const n = src.count ?? src.pieces.length;             // (an overflow's prompt: the first chips only)
  const frac = Math.min(1, n / src.max_model_len);
  // characters per token of the user's own text (its own tokenization, without the chat template)
  const u = src.userTokens;
  const perTok = u && u.tokens ? u.chars / u.tokens : null;
  clear(body,
    live(preview ? "the engine's tokenizer (preview while you type)" : "the request's prompt_token_ids"),
    el("div", { class: "row", id: "prompt-tokens", dataset: { ids: JSON.stringify(src.prompt_ids || src.ids),
      source: preview ? "tokenize" : "engine", count: n } },
    src.pieces.map((p) => tokenChip(p)), n > src.pieces.length ? el("span", { class: "note" }, ` … ${n - src.pieces.length} more`) : null),
    el("p", { class: "note" },
      `${n} tokens${src.template_used ? " (the chat template and its special tokens included)" : ""}`,
      perTok ? el("span", { id: "chars-per-token", dataset: { chars: u.chars, tokens: u.tokens, ratio: perTok, words: u.words ?? "" } },
        ` · your text: ${u.chars} characters in ${u.tokens} tokens = ${perTok.toFixed(1)} characters per token`
        + (u.words ? `, ${u.words} words = ${(u.tokens / u.words).toFixed(2)} tokens per word (rule of thumb: 1.33, i.e. ¾ of a word per token)` : "")
        + (src.template_used ? " (counted without the template)" : "")) : "",
      " · · is a space, ↵ a newline, dashed boxes are raw byte pieces, dark ones special tokens."),
    el("div", { class: "meter", title: "prompt tokens against the context window" },
      el("div", { style: { width: `${(100 * frac).toFixed(2)}%` } })),
    el("p", { class: "note", id: "ctx-count", dataset: { n, ctx: src.max_model_len } },
      `${n} of ${src.max_model_len} tokens of the context window`));
}
