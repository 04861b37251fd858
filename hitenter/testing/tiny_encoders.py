"""Tiny random GGUFs of the embedding and reranking families, laid out as llama.cpp's convert_hf_to_gguf.py
writes them (tests only): llama.cpp's tensor names and metadata keys (src/llama-arch.cpp), the graphs of
src/models/bert.cpp, nomic-bert.cpp, gemma-embedding.cpp and qwen3.cpp, pooling as llama-graph.cpp's
build_pooling / build_dense_out. `write_tiny_encoder(path, family)` writes one in well under a second;
scripts/make_encoder_goldens.py runs llama.cpp's embedding mode on them (tests/goldens/encoders/).

Hidden 64, 4 heads (2 KV heads for the decoders and EmbeddingGemma), ffn 128, F32 (or the layers'
projections in `quant`). Families (name: general.architecture, pooling_type):

- bert (bert, cls): BGE-shaped. 2 layers, context 128, position_embd [128, 64], token_types [2, 64] (row 0
  added to every token), token_embd_norm (LayerNorm w + b), q/k/v/output with biases, attn_output_norm and
  layer_output_norm (LayerNorms), ffn_up / ffn_down with biases (GELU), layer_norm_epsilon 1e-12,
  attention.causal false. The WordPiece vocabulary of `add_wordpiece_tokenizer`.
- bert_rank (bert, rank): bge-reranker-shaped: bert plus the classifier head cls.weight [64, 64],
  cls.bias, cls.output.weight [1, 64], cls.output.bias [1]: score = out(tanh(cls(x[CLS]))).
- bert_rank_xlmr (bert, rank): bge-reranker-v2-m3-shaped (an XLM-R cross-encoder): bert_rank with the
  unigram vocabulary of `add_unigram_tokenizer` and token_types [1, 64] (XLM-R has one token type).
- nomic-bert (nomic-bert, mean): nomic-embed-text-shaped. 2 layers, fused attn_qkv [192, 64] without biases,
  RoPE NEOX at rope.freq_base 1000, SwiGLU ffn_gate / ffn_up / ffn_down, BERT's LayerNorms, token_types,
  no position embeddings. WordPiece vocabulary.
- nomic-bert-moe (nomic-bert-moe, mean): nomic-embed-text-v2-moe-shaped. nomic-bert's attention with an
  attn_qkv bias, token_types [1, 64]; layer 0 BERT's GELU ffn_up / ffn_down with biases, layer 1
  (moe_every_n_layers 2) a mixture: ffn_gate_inp [4, 64], ffn_up_exps [4, 128, 64], ffn_down_exps
  [4, 64, 128], 2 experts used. The unigram ("t5") vocabulary of `add_unigram_tokenizer`.
- gemma-embedding (gemma-embedding, mean): EmbeddingGemma-shaped. 6 layers (llama.cpp's pattern 6: 0-4
  local, 5 global), head_dim 32, 4 heads / 2 KV heads, sliding_window 8 (symmetric: |i - j| <= 4), rope
  freq_base 1e6 and freq_base_swa 1e4, Gemma 3's norms (1 + w stored), QK-norm, GeGLU, output_norm, and the
  Dense heads dense_2 [128, 64], dense_3 [64, 128] with their dense_{2,3}_feat_{in,out} keys. The tiny
  GPT-2-style vocabulary of tiny_model (the tokenizer is not under test here).
- qwen3_embed (qwen3, last): Qwen3-Embedding-shaped: tiny_families' qwen3 layout (2 layers, head_dim 32,
  QK-norm, tied), pooling_type last.
- qwen3_rank (qwen3, rank): Qwen3-Reranker-shaped: qwen3_embed plus cls.output.weight [2, 64] (the "yes" and
  "no" rows of the head, as convert writes them), classifier.output_labels ["yes", "no"], and a rerank
  prompt template (tokenizer.chat_template.rerank, RERANK_TEMPLATE): score = softmax(cls.output(x[last]))[0].
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf

from hitenter.testing.tiny_families import _Writer
from hitenter.testing.tiny_model import add_tokenizer

ENCODERS = ("bert", "bert_rank", "bert_rank_xlmr", "nomic-bert", "nomic-bert-moe", "gemma-embedding", "qwen3_embed",
            "qwen3_rank")
ARCHITECTURES = {"bert": "bert", "bert_rank": "bert", "bert_rank_xlmr": "bert", "nomic-bert": "nomic-bert",
                 "nomic-bert-moe": "nomic-bert-moe",
                 "gemma-embedding": "gemma-embedding", "qwen3_embed": "qwen3", "qwen3_rank": "qwen3"}
POOLING = {"bert": gguf.PoolingType.CLS, "bert_rank": gguf.PoolingType.RANK, "nomic-bert": gguf.PoolingType.MEAN,
           "bert_rank_xlmr": gguf.PoolingType.RANK, "nomic-bert-moe": gguf.PoolingType.MEAN,
           "gemma-embedding": gguf.PoolingType.MEAN, "qwen3_embed": gguf.PoolingType.LAST,
           "qwen3_rank": gguf.PoolingType.RANK}
HIDDEN, HEADS, FFN, CONTEXT = 64, 4, 128, 128
LAYERS, QWEN3_HEAD_DIM, QWEN3_KV_HEADS = 2, 32, 2   # bench/embeddings.py writes realistic shapes by setting these
MOE_EXPERTS = 4
UNIGRAM = ("bert_rank_xlmr", "nomic-bert-moe")     # the families with the unigram ("t5") vocabulary
# Qwen3-Reranker's template in the shape convert writes it (tokenizer.chat_template.rerank), shortened
RERANK_TEMPLATE = ("<|im_start|>system\nJudge: yes or no.<|im_end|>\n<|im_start|>user\n<Query>: {query}\n"
                   "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n")

# the texts the goldens tokenize with llama.cpp, and the rerank query and documents they score
TEXTS = ["Hello world!", "what is the capital of France?", "The cats sat on the mat.",
         "  paris,berlin (germany) ", "playing fishing runs xyz-42", "Qqq zzz"]
QUERY = "what is the capital of france?"
DOCS = ["paris is the capital of france.", "berlin is the capital of germany.", "the cat sat on the mat."]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "hello", "world", "is", "what", "how", "many", "good",
         "bad", "query", "document", "paris", "capital", "of", "france", "berlin", "germany", "it", "run",
         "play", "fish", "water", "blue", "sky", "i", "you", "and", "in", "to"]
PIECES = ["s", "ing", "ed", "er", "ly"]
PUNCT = [".", ",", "?", "!", "'", "-", "(", ")"]


def wordpiece_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token types) of the tiny WordPiece vocabulary as convert writes BERT's: word-initial pieces
    with the phantom space "\u2581", continuation pieces ("##x") bare, specials CONTROL."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    words = list(dict.fromkeys(WORDS + letters + PUNCT))
    tokens = SPECIALS + ["\u2581" + t for t in words] + list(dict.fromkeys(letters + PIECES))
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    return tokens, [int(t) for t in types]


def add_wordpiece_tokenizer(w: gguf.GGUFWriter) -> int:
    """The tiny WordPiece ("bert") vocabulary with its special ids; the vocab size."""
    tokens, types = wordpiece_vocab()
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_bos_token_id(SPECIALS.index("[CLS]"))
    w.add_unk_token_id(SPECIALS.index("[UNK]"))
    w.add_sep_token_id(SPECIALS.index("[SEP]"))
    w.add_pad_token_id(SPECIALS.index("[PAD]"))
    w.add_mask_token_id(SPECIALS.index("[MASK]"))
    return len(tokens)


def add_unigram_tokenizer(w: gguf.GGUFWriter) -> int:
    """A tiny SentencePiece unigram ("t5") vocabulary shaped as XLM-R's (<s> <pad> </s> <unk> first, word
    pieces with "▁", scores by length, add_bos / add_eos, dummy prefix, extra spaces removed; no
    precompiled charsmap); the vocab size."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    pieces = list(dict.fromkeys(["▁" + t for t in WORDS + letters] + ["▁"] + letters + PIECES + PUNCT))
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + pieces
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 4 + [-1.0 - 8.0 / (1 + len(t)) for t in pieces])
    w.add_token_types([int(gguf.TokenType.CONTROL)] * 3 + [int(gguf.TokenType.UNKNOWN)]
                      + [int(gguf.TokenType.NORMAL)] * len(pieces))
    w.add_token_type_count(1)
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_unk_token_id(3)
    w.add_sep_token_id(2)
    w.add_pad_token_id(1)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    return len(tokens)


def _bert(f: _Writer, family: str) -> None:
    nomic = family in ("nomic-bert", "nomic-bert-moe")
    moe = family == "nomic-bert-moe"
    w = f.w
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(POOLING[family])
    if nomic:
        w.add_rope_freq_base(1000.0)
    if moe:
        w.add_expert_count(MOE_EXPERTS)
        w.add_expert_used_count(2)
        w.add_uint32("nomic-bert-moe.moe_every_n_layers", 2)
    vocab = f.finish_metadata()
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.5))
    f.add("token_types.weight", f.normal(1 if family in UNIGRAM else 2, HIDDEN, std=0.3))
    if not nomic:
        f.add("position_embd.weight", f.normal(CONTEXT, HIDDEN, std=0.3))
    f.add("token_embd_norm.weight", f.norm(HIDDEN))
    f.add("token_embd_norm.bias", f.normal(HIDDEN, std=0.1))
    for i in range(LAYERS):
        p = f"blk.{i}."
        if nomic:
            f.add(p + "attn_qkv.weight", f.normal(3 * HIDDEN, HIDDEN, std=0.2))
            if moe:
                f.add(p + "attn_qkv.bias", f.normal(3 * HIDDEN, std=0.1))
        else:
            for n in ("attn_q", "attn_k", "attn_v"):
                f.add(p + n + ".weight", f.normal(HIDDEN, HIDDEN, std=0.2))
                f.add(p + n + ".bias", f.normal(HIDDEN, std=0.1))
        f.add(p + "attn_output.weight", f.normal(HIDDEN, HIDDEN, std=0.15))
        f.add(p + "attn_output.bias", f.normal(HIDDEN, std=0.1))
        f.add(p + "attn_output_norm.weight", f.norm(HIDDEN))
        f.add(p + "attn_output_norm.bias", f.normal(HIDDEN, std=0.1))
        if moe and i % 2 == 1:
            f.add(p + "ffn_gate_inp.weight", f.normal(MOE_EXPERTS, HIDDEN, std=0.3))
            f.add(p + "ffn_up_exps.weight", f.normal(MOE_EXPERTS, FFN, HIDDEN, std=0.15))
            f.add(p + "ffn_down_exps.weight", f.normal(MOE_EXPERTS, HIDDEN, FFN, std=0.15))
        else:
            _ffn(f, p, gated=nomic and not moe)
        f.add(p + "layer_output_norm.weight", f.norm(HIDDEN))
        f.add(p + "layer_output_norm.bias", f.normal(HIDDEN, std=0.1))
    if family in ("bert_rank", "bert_rank_xlmr"):
        f.add("cls.weight", f.normal(HIDDEN, HIDDEN, std=0.2))
        f.add("cls.bias", f.normal(HIDDEN, std=0.1))
        f.add("cls.output.weight", f.normal(1, HIDDEN, std=0.5))
        f.add("cls.output.bias", f.normal(1, std=0.1))


def _ffn(f: _Writer, p: str, gated: bool) -> None:
    """SwiGLU without biases (nomic-bert), or BERT's GELU up / down with biases."""
    f.add(p + "ffn_up.weight", f.normal(FFN, HIDDEN, std=0.15))
    if gated:
        f.add(p + "ffn_gate.weight", f.normal(FFN, HIDDEN, std=0.15))
    else:
        f.add(p + "ffn_up.bias", f.normal(FFN, std=0.1))
    f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.15))
    if not gated:
        f.add(p + "ffn_down.bias", f.normal(HIDDEN, std=0.1))


def _qk_norm_attention(f: _Writer, p: str, head_dim: int, kv_heads: int) -> None:
    """Layer p's q / k / v / output projections and q / k norms, in the order the goldens were drawn in."""
    f.add(p + "attn_q.weight", f.normal(HEADS * head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_k.weight", f.normal(kv_heads * head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_v.weight", f.normal(kv_heads * head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_output.weight", f.normal(HIDDEN, HEADS * head_dim, std=0.1))
    f.add(p + "attn_q_norm.weight", f.norm(head_dim))
    f.add(p + "attn_k_norm.weight", f.norm(head_dim))


def _gemma_embedding(f: _Writer) -> None:
    head_dim, layers, kv_heads = 32, 6, 2
    w = f.w
    f.hparams(layers, 2048, FFN, 1e-6, heads=HEADS, kv_heads=kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(8)
    w.add_pooling_type(POOLING["gemma-embedding"])
    w.add_causal_attention(False)
    w.add_dense_features_dims("dense_2", HIDDEN, 2 * HIDDEN)
    w.add_dense_features_dims("dense_3", 2 * HIDDEN, HIDDEN)
    vocab = f.finish_metadata()
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.12))
    f.add("output_norm.weight", f.norm(HIDDEN))
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _qk_norm_attention(f, p, head_dim, kv_heads)
        f.add(p + "post_attention_norm.weight", f.norm(HIDDEN))
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        for n in ("ffn_gate", "ffn_up"):
            f.add(p + n + ".weight", f.normal(FFN, HIDDEN, std=0.15))
        f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.1))
        f.add(p + "post_ffw_norm.weight", f.norm(HIDDEN))
    f.add("dense_2.weight", f.normal(2 * HIDDEN, HIDDEN, std=1 / math.sqrt(HIDDEN)))
    f.add("dense_3.weight", f.normal(HIDDEN, 2 * HIDDEN, std=1 / math.sqrt(2 * HIDDEN)))


def _qwen3(f: _Writer, family: str) -> None:
    head_dim, kv_heads = QWEN3_HEAD_DIM, QWEN3_KV_HEADS
    w = f.w
    f.hparams(LAYERS, 4096, FFN, 1e-6, heads=HEADS, kv_heads=kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_pooling_type(POOLING[family])
    if family == "qwen3_rank":
        w.add_classifier_output_labels(["yes", "no"])
    vocab = f.finish_metadata()
    if family == "qwen3_rank":
        w.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.5))
    f.add("output_norm.weight", f.norm(HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _qk_norm_attention(f, p, head_dim, kv_heads)
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        for n in ("ffn_gate", "ffn_up"):
            f.add(p + n + ".weight", f.normal(FFN, HIDDEN, std=0.15))
        f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.1))
    if family == "qwen3_rank":
        f.add("cls.output.weight", f.normal(2, HIDDEN, std=0.5))


def write_tiny_encoder(path: str | Path, family: str, seed: int = 0, quant: str | None = None) -> Path:
    """Write the tiny random `family` model (one of ENCODERS) to `path`; return it. The same arguments always
    give the same bytes. quant: None (F32) or a GGML type name for the layers' projection matrices."""
    if family not in ENCODERS:
        raise ValueError(f"unknown tiny encoder {family!r}; known: {', '.join(ENCODERS)}")
    path = Path(path)
    bert_like = family in ("bert", "bert_rank", "bert_rank_xlmr", "nomic-bert", "nomic-bert-moe")
    tokenizer = (add_unigram_tokenizer if family in UNIGRAM else add_wordpiece_tokenizer if bert_like
                 else add_tokenizer)
    f = _Writer(path, ARCHITECTURES[family], family, seed, quant, tokenizer=tokenizer)
    if bert_like:
        _bert(f, family)
    elif family == "gemma-embedding":
        _gemma_embedding(f)
    else:
        _qwen3(f, family)
    f.close()
    return path
