"""llama.cpp's load-time token attributes (llama-vocab.cpp, `llama_vocab::impl::load`), from GGUF metadata.

Contract of `vocab_attributes(md) -> VocabAttrs`, applying llama.cpp's rules in its order:
1. `file_types`: `tokenizer.ggml.token_type` as stored (NORMAL when absent); `types` starts as a copy.
2. Auto-detection by text: the eot / eom / FIM slots not given by `tokenizer.ggml.*_token_id` take the
   lowest id among their known names (`_EOT_NAMES`, `_FIM_NAMES`, "<|eom_id|>"), and become CONTROL.
3. End of generation: FIM pad / repo / sep, eos, eot, eom and every token named in `_EOG_NAMES` (these
   become CONTROL).
4. gpt-oss (harmony): "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>" become USER_DEFINED, so
   they are rendered in output text even when control tokens are not.
5. When the EOG set holds "<|return|>" and "<|call|>" (or "<|calls|>"), or "<|call|>"/"<|calls|>" and
   "<|flush|>", and also "<|end|>", then "<|end|>" leaves the EOG set and becomes USER_DEFINED (harmony:
   `<|end|>` closes the `analysis` message, the reply goes on to the `final` channel).
6. When the EOG set holds "<|tool_response>" (Gemma 4) or "<|plamo:eos|>" and "</s>", "</s>" leaves it
   and becomes NORMAL.
7. Strip flags: a model name (lower-cased `general.name`) containing "phi-3" or "phi3" gives every
   CONTROL / USER_DEFINED / UNKNOWN token and "</s>" RSTRIP, except "<unk>", "<s>", "<|endoftext|>";
   pre-tokenizers jina-v2-de / -es / -code give "<mask>" LSTRIP.
Plus `add_space_prefix` (`tokenizer.ggml.add_space_prefix`, default True for SentencePiece, False for BPE)
and `clean_spaces` (llama.cpp's per pre-tokenizer clean-up of " ?", " 's" ... in `llama_detokenize`; True
for BPE unless the pre-tokenizer turns it off, False for SentencePiece).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hitenter.errors import ModelLoadError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_NAMES: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
_EOG_NAMES = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<｜end▁of▁sentence｜>", "[e~["))
_HARMONY_MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
# BPE pre-tokenizer names for which llama.cpp sets clean_spaces = false (llama-vocab.cpp, load())
_NO_CLEAN_SPACES = frozenset((
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "jais-2", "sarvam-moe", "command-r",
    "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "poro-chat", "viking", "tekken", "smollm", "chameleon",
    "gpt-4o", "llama4", "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe",
    "trillion", "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "hunyuan",
    "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe", "laguna", "minimax-m2",
    "solar-open"))


@dataclass(frozen=True)
class VocabAttrs:
    """Per-token types after llama.cpp's overrides, the special ids and the detokenizer flags."""

    file_types: list[int]
    types: list[int]
    eot: int | None
    eog: frozenset[int]
    lstrip: frozenset[int]
    rstrip: frozenset[int]
    add_space_prefix: bool
    clean_spaces: bool


def _token_id(md: Mapping[str, Any], key: str, n: int) -> int | None:
    v = md.get(f"tokenizer.ggml.{key}")
    return int(v) if v is not None and 0 <= int(v) < n else None


def _detect_slots(md: Mapping[str, Any], ids: Mapping[str, int], types: list[int]) -> dict[str, int | None]:
    """Rule 2: the eot / eom / FIM ids, given or detected by name (detected ones become CONTROL)."""
    n = len(types)
    found: dict[str, int | None] = {k: _token_id(md, f"{k}_token_id", n) for k in ("eot", "eom")}
    found.update({k: _token_id(md, f"fim_{k}_token_id", n) for k in _FIM_NAMES})
    for slot, names in {"eot": _EOT_NAMES, "eom": ("<|eom_id|>",), **_FIM_NAMES}.items():
        hits = [ids[name] for name in names if name in ids]
        if found[slot] is None and hits:
            found[slot] = min(hits)
            types[min(hits)] = CONTROL
    return found


def _eog_set(md: Mapping[str, Any], ids: Mapping[str, int], types: list[int],
             found: Mapping[str, int | None]) -> set[int]:
    """Rules 3-6: the end-of-generation ids; `types` updated in place."""
    eos = _token_id(md, "eos_token_id", len(types))
    eog = {v for v in (found["pad"], found["rep"], found["sep"], eos, found["eot"], found["eom"]) if v is not None}
    for name in _EOG_NAMES & ids.keys():
        eog.add(ids[name])
        types[ids[name]] = CONTROL
    for name in _HARMONY_MARKUP:
        if name in ids:
            types[ids[name]] = USER_DEFINED
    in_eog = {name: ids[name] for name in ("<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|end|>",
                                           "<|tool_response>", "<|plamo:eos|>", "</s>")
              if name in ids and ids[name] in eog}
    has_call = "<|call|>" in in_eog or "<|calls|>" in in_eog
    if "<|end|>" in in_eog and has_call and ("<|return|>" in in_eog or "<|flush|>" in in_eog):
        eog.discard(in_eog["<|end|>"])
        types[in_eog["<|end|>"]] = USER_DEFINED
    if "</s>" in in_eog and ("<|tool_response>" in in_eog or "<|plamo:eos|>" in in_eog):
        eog.discard(in_eog["</s>"])
        types[in_eog["</s>"]] = NORMAL
    return eog


def _strip_flags(md: Mapping[str, Any], ids: Mapping[str, int],
                 types: list[int]) -> tuple[frozenset[int], frozenset[int]]:
    """Rule 7: (LSTRIP ids, RSTRIP ids)."""
    name = str(md.get("general.name") or "").lower()
    pre = str(md.get("tokenizer.ggml.pre") or "")
    lstrip: set[int] = set()
    rstrip: set[int] = set()
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) and "<mask>" in ids:
        lstrip.add(ids["<mask>"])
    elif "phi-3" in name or "phi3" in name:
        rstrip = {i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)}
        rstrip |= {ids[t] for t in ("</s>",) if t in ids}
        rstrip -= {ids[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in ids}
    return frozenset(lstrip), frozenset(rstrip)


def vocab_attributes(md: Mapping[str, Any]) -> VocabAttrs:
    """llama.cpp's token types, EOG set, strip flags and detokenizer flags for this vocabulary."""
    tokens = md["tokenizer.ggml.tokens"]
    n = len(tokens)
    stored = md.get("tokenizer.ggml.token_type")
    file_types = [int(t) for t in stored] if stored is not None else [NORMAL] * n
    if len(file_types) != n:
        raise ModelLoadError(f"tokenizer.ggml.token_type has {len(file_types)} entries for {n} tokens")
    ids = {t: i for i, t in enumerate(tokens)}  # later duplicates win, as in llama.cpp's token_to_id
    types = list(file_types)
    found = _detect_slots(md, ids, types)
    eog = _eog_set(md, ids, types, found)
    lstrip, rstrip = _strip_flags(md, ids, types)
    spm = md.get("tokenizer.ggml.model") == "llama"
    pre = str(md.get("tokenizer.ggml.pre") or "default")
    return VocabAttrs(file_types=file_types, types=types, eot=found["eot"], eog=frozenset(eog), lstrip=lstrip,
                      rstrip=rstrip, add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", spm)),
                      clean_spaces=not spm and pre not in _NO_CLEAN_SPACES)
