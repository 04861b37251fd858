"""Synthetic Qwen3-Embedding-0.6B / Qwen3-Reranker-0.6B-shaped GGUFs, for running hitenter and llama-server
on the same file (bench/embeddings.py ``--shape qwen3-embedding-0.6b``).

    .venv/bin/python bench/synthetic_qwen3_embedding.py --kind embed --out /tmp/qwen3-embed-syn.gguf

The shape is Qwen3-Embedding-0.6B's config.json: ``qwen3``, 28 layers, hidden 1024, 16 query heads and 8 KV
heads of head_dim 128 (so q is 2048 wide), ffn 3072 (SwiGLU), vocab 151669, rms eps 1e-6, rope theta 1e6,
tied embeddings (no output.weight), QK-norm. Written as llama.cpp's convert_hf_to_gguf.py writes it:
llama.cpp's tensor names and metadata keys; every matrix and the token embedding in ``--quant`` (Q8_0 or
F16, the types the real files ship in), norms F32; ``pooling_type`` last for ``embed``; for ``rank``
(Qwen3-Reranker) pooling rank, ``classifier.output_labels`` ["yes", "no"], ``cls.output.weight`` [2, 1024]
and convert's rerank prompt template (``tokenizer.chat_template.rerank``).

The vocabulary is a real one: the byte-level BPE tokens, merges and token types of a Qwen2.5 GGUF
(``--tokenizer-from``, default the registry's qwen2.5-coder-0.5b-instruct), cut to its 151665 real tokens
and given Qwen3's four added tokens (<tool_response>, </tool_response>, <think>, </think>) for 151669; eos
and pad <|endoftext|>, appended to every input (add_eos_token) as Qwen3-Embedding's tokenizer does, no bos.
Weights are random (std 0.02, norms 1): the vectors are meaningless, the work per token is the real model's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

SHAPE = dict(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, ffn=3072, vocab=151669, context=32768)
QWEN3_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN25_REAL_TOKENS = 151665            # Qwen2.5's BPE tokens and specials, before its [PAD...] filler
ENDOFTEXT = 151643
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: "
    "Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n"
    "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
_ROWS_PER_CHUNK = 8192


def add_qwen3_vocab(w: gguf.GGUFWriter, src: Path) -> int:
    """Qwen3's 151669-token vocabulary built from a Qwen2.5 GGUF's tokenizer.* keys; the vocab size."""
    r = gguf.GGUFReader(str(src))
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())[:QWEN25_REAL_TOKENS] + QWEN3_ADDED
    types = list(r.fields["tokenizer.ggml.token_type"].contents())[:QWEN25_REAL_TOKENS]
    types += [int(gguf.TokenType.USER_DEFINED)] * len(QWEN3_ADDED)
    if tokens[ENDOFTEXT] != "<|endoftext|>" or len(tokens) != SHAPE["vocab"]:
        raise ValueError(f"{src}: not a Qwen2.5 vocabulary (token {ENDOFTEXT} is {tokens[ENDOFTEXT]!r})")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(r.fields["tokenizer.ggml.merges"].contents()))
    w.add_eos_token_id(ENDOFTEXT)
    w.add_pad_token_id(ENDOFTEXT)
    w.add_bos_token_id(ENDOFTEXT)
    w.add_add_bos_token(False)
    w.add_add_eos_token(True)
    return len(tokens)


class _File:
    def __init__(self, path: Path, quant: str, seed: int) -> None:
        self.w = gguf.GGUFWriter(str(path), "qwen3")
        self.q = gguf.GGMLQuantizationType[quant]
        self.rng = np.random.default_rng(seed)

    def matrix(self, name: str, rows: int, cols: int, std: float = 0.02) -> None:
        """A random [rows, cols] matrix (torch order) in the file's type, quantized a chunk of rows at a time."""
        parts = []
        for r0 in range(0, rows, _ROWS_PER_CHUNK):
            n = min(_ROWS_PER_CHUNK, rows - r0)
            block = self.rng.standard_normal((n, cols), dtype=np.float32) * np.float32(std)
            parts.append(gguf.quants.quantize(block, self.q))
        raw = np.concatenate(parts)
        self.w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=self.q)

    def ones(self, name: str, n: int) -> None:
        self.w.add_tensor(name, np.ones(n, dtype=np.float32))


def write(out: Path, kind: str, tokenizer_from: Path, quant: str = "Q8_0", seed: int = 0) -> Path:
    """Write the ``embed`` or ``rank`` file to ``out``; return it."""
    if kind not in ("embed", "rank"):
        raise ValueError(f"kind: {kind!r} is not embed or rank")
    s = SHAPE
    f = _File(out, quant, seed)
    w = f.w
    w.add_name("synthetic-qwen3-" + ("embedding" if kind == "embed" else "reranker") + "-0.6b")
    w.add_block_count(s["layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_file_type(int(getattr(gguf.LlamaFileType, f"MOSTLY_{quant}")))
    if kind == "embed":
        w.add_pooling_type(gguf.PoolingType.LAST)
    else:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
    vocab = add_qwen3_vocab(w, tokenizer_from)
    if kind == "rank":
        w.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)
    h, d = s["hidden"], s["head_dim"]
    f.matrix("token_embd.weight", vocab, h, std=0.05)
    f.ones("output_norm.weight", h)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        f.ones(p + "attn_norm.weight", h)
        f.matrix(p + "attn_q.weight", s["heads"] * d, h)
        f.matrix(p + "attn_k.weight", s["kv_heads"] * d, h)
        f.matrix(p + "attn_v.weight", s["kv_heads"] * d, h)
        f.matrix(p + "attn_output.weight", h, s["heads"] * d)
        f.ones(p + "attn_q_norm.weight", d)
        f.ones(p + "attn_k_norm.weight", d)
        f.ones(p + "ffn_norm.weight", h)
        f.matrix(p + "ffn_gate.weight", s["ffn"], h)
        f.matrix(p + "ffn_up.weight", s["ffn"], h)
        f.matrix(p + "ffn_down.weight", h, s["ffn"])
    if kind == "rank":
        f.matrix("cls.output.weight", 2, h, std=0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def default_tokenizer_source() -> Path:
    """The registry's qwen2.5-coder-0.5b-instruct GGUF (pulled if missing)."""
    from hitenter.models.registry import resolve_model
    return Path(resolve_model("qwen2.5-coder-0.5b-instruct"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("embed", "rank"), default="embed")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quant", choices=("Q8_0", "F16"), default="Q8_0")
    ap.add_argument("--tokenizer-from", type=Path, help="a Qwen2.5 GGUF whose vocabulary to use (default: the "
                    "registry's qwen2.5-coder-0.5b-instruct)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    write(args.out, args.kind, args.tokenizer_from or default_tokenizer_source(), args.quant, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
