"""A tiny o200k-style vocabulary for gpt-oss GGUFs (tests only): llama.cpp's `gpt-4o` pre-tokenizer and the
harmony special tokens, laid out as convert_hf_to_gguf.py writes gpt-oss (tokenizer model "gpt2", pre
"gpt-4o", the special tokens after the normal ones, all of type CONTROL, BOS <|startoftext|>, EOS
<|return|>, padding <|endoftext|>, no BOS added).

- `harmony_vocab()` -> (tokens, token_types, merges): the 256 byte tokens in GPT-2's byte-to-unicode form,
  `N_MERGES` merges learned by plain byte-pair counting over `TRAINING_TEXT` taken as one string (so merges
  cross the places where pre-tokenizers split: a different split gives different ids), then `SPECIALS`
  in o200k_harmony's order (reserved slots included).
- `add_harmony_tokenizer(w)` writes it into a GGUFWriter with `HARMONY_TEMPLATE` (a compact chat template in
  the harmony format: `<|start|>{role}<|message|>{content}<|end|>`, an assistant's `thinking` as an
  `analysis` message, its content on the `final` channel) and returns the vocabulary size; pass it as
  `write_tiny_family(path, "gpt-oss", tokenizer=add_harmony_tokenizer)`.
"""

from __future__ import annotations

from collections import Counter

import gguf

from hitenter.tokenizer.bpe import bytes_to_unicode

NORMAL, CONTROL = 1, 3
N_MERGES = 400
SPECIALS = ("<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
            "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
            "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>")
TRAINING_TEXT = (
    "The user asks what 2+2 is. We'll answer: it's 4. I'm sure they're fine, you've seen it, he'd know.\n"
    "HTTPServer parses JSONData; getHTTPResponse returns XMLHttpRequest objects in CamelCase and ALLCAPS.\n"
    "Numbers: 1 12 123 1234 12345 123456 3.14159 1,000,000 and 2026-01-31, phone 555-0100.\n"
    "  indented code:\n\tdef f(x):\n\t\treturn x  # comment\n\n\npath/to/file.txt, a/b/c, https://example.com/x?y=1\n"
    "Ünïcödé wörds, straße, ÉCOLE, Ωmega, добрый день, 東京は日本の首都です, "
    "e\u0301 n\u0303, عربى, हिन्दी.\n"
    "analysis commentary final assistant system developer user functions.get_weather to=functions json "
    "{\"location\": \"Paris\"} Reasoning: low medium high. Valid channels: analysis, commentary, final.\n"
)
HARMONY_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- if m.thinking -%}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)


def _learn_merges(text: str, n: int) -> list[tuple[str, str]]:
    """`n` byte-pair merges over `text` as one sequence: the most frequent adjacent pair each round
    (ties: the smallest pair), never merging across a newline so the vocabulary stays small."""
    table = bytes_to_unicode()
    seq = [table[b] for b in text.encode("utf-8")]
    merges: list[tuple[str, str]] = []
    for _ in range(n):
        pairs = Counter((a, b) for a, b in zip(seq, seq[1:], strict=False) if "Ċ" not in (a, b))
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        out: list[str] = []
        i = 0
        while i < len(seq):
            if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                out.append(seq[i] + seq[i + 1])
                i += 2
            else:
                out.append(seq[i])
                i += 1
        seq = out
    return merges


def harmony_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the tiny harmony vocabulary (see the module docstring)."""
    table = bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    for a, b in _learn_merges(TRAINING_TEXT, N_MERGES):
        merges.append(f"{a} {b}")
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
    types = [NORMAL] * len(tokens) + [CONTROL] * len(SPECIALS)
    return tokens + list(SPECIALS), types, merges


def add_harmony_tokenizer(w: gguf.GGUFWriter) -> int:
    """Write the tiny harmony vocabulary and template into `w` (see the module docstring); the vocab size."""
    tokens, types, merges = harmony_vocab()
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|startoftext|>"])
    w.add_eos_token_id(ids["<|return|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(HARMONY_TEMPLATE)
    return len(tokens)
