"""Tiny random Llama / Qwen2 GGUF models with a small GPT-2-style BPE tokenizer (tests only).

`write_tiny_gguf(path, ...)` writes, in well under a second, a complete GGUF that hitenter's loader and
tokenizer accept: llama/qwen2 hyper-parameters, random but well-scaled weights (llama Q/K stored in
the GGUF permuted layout, like convert_hf_to_gguf does, so RoPE handling gets exercised), and a
tokenizer: specials <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2 (type 3, control), the 256 byte
tokens in GPT-2 byte-to-unicode form (type 1), then merged tokens with matching merges; bos=1,
eos=2, add_bos_token False, pre "smollm", and a ChatML chat template.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hitenter.tokenizer.bpe import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [
    "Ġ t", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ a", "a t", "e n", "Ġ s", "Ġ w", "o r", "Ġ o",
    "i s", "Ġ c", "e s", "a n", "Ġ h", "Ġ b", "i t", "Ġ m", "Ġ f", "Ġ p", "Ġ d", "a r", "a l", "Ġ i",
    "o u", "e d", "Ġt o", "Ġ l", "l e", "in g", "Ġa n", "Ġan d", "Ġo f", "Ġi s", "Ġ n", "Ġ y", "Ġ H",
    "Ġ T", "l l", "e l", "o w", "Ġw or", "l d", "Ġwor ld", "H e", "He ll", "Hell o",
]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the tiny tokenizer."""
    tokens = list(SPECIALS)
    types = [3] * len(SPECIALS)
    byte_chars = bytes_to_unicode()
    tokens += [byte_chars[b] for b in range(256)]
    types += [1] * 256
    known = set(tokens)
    merges: list[str] = []
    for m in MERGES:
        a, b = m.split(" ")
        if a in known and b in known and a + b not in known:
            merges.append(m)
            tokens.append(a + b)
            types.append(1)
            known.add(a + b)
    return tokens, types, merges


def _permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's llama Q/K permutation (rotate-half rows -> interleaved rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# K-quant and codebook blocks: gguf-py cannot quantize these types, so the tests write random valid blocks:
# random quants, and scales chosen so the weights are small and centred like real ones. Q4_K / Q5_K store
# w = d * sc * q - dmin * m per sub-block; the 12 packed 6-bit (sc, m) bytes all equal to 0x11 * v give
# sc == m in every sub-block, so dmin = d * (q_max / 2) centres w = d * sc * (q - q_max / 2). Q2_K likewise
# (16 bytes of 4-bit (sc, m), each 0x11 * v: dmin = 1.5 d). Q6_K's w = d * sc * (q - 32) with signed int8 sc,
# Q3_K's d * (sc - 32) * (q - 4) and IQ4_XS's d * (sc - 32) * codebook[q] are centred by random scale bytes,
# IQ4_NL's d * codebook[q] by its near-symmetric codebook. Values: (offset of d, d, dmin / d).
_KQUANT_SCALES = {"Q4_K": (0, 2e-4, 7.5), "Q5_K": (0, 1e-4, 15.5), "Q6_K": (208, 2e-5, None),
                  "Q2_K": (80, 1e-3, 1.5), "Q3_K": (108, 2e-4, None), "IQ4_NL": (0, 1e-4, None),
                  "IQ4_XS": (0, 1e-5, None)}


def random_kquant(qtype: gguf.GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid `rows x cols` blocks of a type in `_KQUANT_SCALES` (`uint8 [rows, cols / block * block_bytes]`)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    d_at, d, dmin_ratio = _KQUANT_SCALES[qtype.name]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    raw[..., d_at:d_at + 2] = np.array([d], np.float16).view(np.uint8)
    if qtype.name in ("Q4_K", "Q5_K"):   # d, dmin, scales[12], ...
        raw[..., 2:4] = np.array([d * dmin_ratio], np.float16).view(np.uint8)
        raw[..., 4:16] = (0x11 * rng.integers(1, 16, size=(rows, cols // block, 1))).astype(np.uint8)
    elif qtype.name == "Q2_K":           # scales[16], qs[64], d, dmin
        raw[..., 82:84] = np.array([d * dmin_ratio], np.float16).view(np.uint8)
        raw[..., 0:16] = (0x11 * rng.integers(1, 16, size=(rows, cols // block, 16))).astype(np.uint8)
    return raw.reshape(rows, -1)


def _tensor_type(name: str, quant: str | dict[str, str] | None) -> gguf.GGMLQuantizationType | None:
    """The GGML type for tensor `name`: `quant` itself, or the entry whose key `name` contains."""
    if quant is None or isinstance(quant, str):
        return None if quant is None else gguf.GGMLQuantizationType[quant]
    for part, t in quant.items():
        if part in name:
            return gguf.GGMLQuantizationType[t]
    return None


def add_tokenizer(w: gguf.GGUFWriter, user_defined: tuple[str, ...] = (), template: str = CHATML_TEMPLATE) -> int:
    """The tiny GPT-2-style vocabulary (then `user_defined` tokens, type 4), BOS 1 / EOS 2 (no BOS added) and
    `template` (ChatML by default); the vocab size."""
    tokens, types, merges = tiny_vocab()
    tokens += list(user_defined)
    types += [4] * len(user_defined)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    return len(tokens)


def add_shape(w: gguf.GGUFWriter, layers: int, context_length: int, hidden: int, ffn: int, heads: int,
              kv_heads: int) -> None:
    """A decoder's block count, context length, widths and head counts."""
    w.add_block_count(layers)
    w.add_context_length(context_length)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)


def add_weight(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: gguf.GGMLQuantizationType | None,
               rng: np.random.Generator) -> None:
    """Write `arr` as F32, or in `qtype` when given and its rows are whole blocks (K-quants: `random_kquant`)."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if qtype is not None and arr.ndim == 2 and arr.shape[1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
        data = (random_kquant(qtype, *arr.shape, rng) if qtype.name in _KQUANT_SCALES
                else gguf.quants.quantize(arr, qtype))
        w.add_tensor(name, data, raw_dtype=qtype)
        return
    w.add_tensor(name, arr)


def write_tiny_gguf(path: str | Path, arch: str = "llama", seed: int = 0, hidden: int = 64, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, ffn: int = 128, context_length: int = 256,
                    quant: str | dict[str, str] | None = None, tied: bool | None = None) -> Path:
    """Write a random `arch` ("llama" | "qwen2") model with the tiny tokenizer to `path`; return it.

    quant: None (all F32), or a GGML type name ("Q8_0", "Q4_0", "F16", ...) used for the 2-D projection
    weights whose row length allows it (the rest stay F32), or a dict from a tensor-name part
    ("attn_v", "ffn_down", "token_embd", ...) to a type name, for a mix like Q4_K_M's. Types gguf-py cannot
    quantize (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: rows of a multiple of 256; IQ4_NL) get random valid
    blocks (see `random_kquant`), not the quantized random weights. tied: tie the output head to the embedding (default: llama tied, qwen2
    separate output.weight).
    """
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    tied = (arch == "llama") if tied is None else tied

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    add_shape(w, layers, context_length, hidden, ffn, heads, kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    vocab = add_tokenizer(w)
    w.add_vocab_size(vocab)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)

    def add(name: str, arr: np.ndarray, quantize: bool = False) -> None:
        add_weight(w, name, arr, _tensor_type(name, quant) if quantize else None, rng)

    def normal(*shape: int, std: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight() -> np.ndarray:
        return (1.0 + rng.standard_normal(hidden) * 0.1).astype(np.float32)

    add("token_embd.weight", normal(vocab, hidden, std=0.5), quantize=True)
    add("output_norm.weight", norm_weight())
    if not tied:
        add("output.weight", normal(vocab, hidden, std=0.1), quantize=True)
    for i in range(layers):
        p = f"blk.{i}."
        q = normal(heads * head_dim, hidden, std=0.15)
        k = normal(kv_heads * head_dim, hidden, std=0.15)
        if arch == "llama":
            q, k = _permute_for_gguf(q, heads), _permute_for_gguf(k, kv_heads)
        add(p + "attn_norm.weight", norm_weight())
        add(p + "attn_q.weight", q, quantize=True)
        add(p + "attn_k.weight", k, quantize=True)
        add(p + "attn_v.weight", normal(kv_heads * head_dim, hidden, std=0.1), quantize=True)
        if arch == "qwen2":
            add(p + "attn_q.bias", normal(heads * head_dim, std=0.1))
            add(p + "attn_k.bias", normal(kv_heads * head_dim, std=0.1))
            add(p + "attn_v.bias", normal(kv_heads * head_dim, std=0.1))
        add(p + "attn_output.weight", normal(hidden, heads * head_dim, std=0.1), quantize=True)
        add(p + "ffn_norm.weight", norm_weight())
        add(p + "ffn_gate.weight", normal(ffn, hidden, std=0.1), quantize=True)
        add(p + "ffn_up.weight", normal(ffn, hidden, std=0.1), quantize=True)
        add(p + "ffn_down.weight", normal(hidden, ffn, std=0.1), quantize=True)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
