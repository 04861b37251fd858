"""Synthetic hybrid GGUFs of realistic proportions, for running hitenter and llama.cpp on the same file.

    .venv/bin/python bench/synthetic_hybrid.py --shape qwen35-2b --out /work/models/qwen35-2b-syn.gguf
    .venv/bin/python bench/synthetic_hybrid.py --shape qwen35moe-a3b --out /work/models/qwen35moe-syn.gguf

Shapes (llama.cpp's `qwen35` / `qwen35moe` tensor names and metadata keys, as convert_hf_to_gguf writes them):

- ``qwen35-2b``: Qwen3.5-2B's proportions: hidden 2048, 24 layers (Gated DeltaNet in 3 of every 4, full
  attention every 4th), DeltaNet 16 key / 16 value heads of 128, conv 4; attention 8 heads x 256 (2 KV heads,
  output gate, partial RoPE over 64 dims); FFN 6144.
- ``qwen35moe-a3b``: Qwen3.5/3.6-35B-A3B's per-token work (hidden 2048, 40 layers, DeltaNet 16 key / 32
  value heads, attention 16 x 256 with 2 KV heads, top-8 experts of width 512 plus a 512-wide shared expert)
  with ``--experts`` experts per layer instead of 256, so the file fits this machine twice (hitenter and
  llama.cpp one after the other). Decode reads what the real model reads per token, less the router rows.

Weights: random but valid Q4_K blocks for every matrix (hitenter/testing/tiny_model.random_kquant), norms 1,
small F32 gates; the vocabulary and chat template copied from a real GGUF (``--tokenizer-from``, default the
registry's qwen2.5-coder-0.5b-instruct, pulled if missing). Random weights make the text meaningless; the
shapes, the bytes read per token and the work per token are the real model's.

``--echo-cycle L`` (for speculative decoding): the embedding and the LM head are instead Q8_0 copies of one
random table, the head's rows permuted so that greedy decoding maps each of L chosen tokens to the next one
of a cycle (the residual stream is dominated by the input token's embedding, so the layers, still random and
still all run, do not change the argmax). A prompt holding the cycle twice is then a repeat-the-text prompt
the model continues exactly, so prompt lookup's drafts are accepted: this measures the engine's speculation
mechanics (a verification pass over k + 1 rows against k + 1 single steps), not a real model's acceptance.
The cycle's token ids are stored under ``ECHO_KEY``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_model import random_kquant

Q = gguf.GGMLQuantizationType.Q4_K
ECHO_KEY = "hitenter.bench.echo_cycle"
ECHO_SCALE = 64.0   # the embedding's size against the layers' unit-RMS outputs added to the residual
SHAPES = {
    "qwen35-2b": dict(arch="qwen35", hidden=2048, layers=24, heads=8, kv_heads=2, head_dim=256, rope_dim=64,
                      k_heads=16, v_heads=16, state=128, ffn=6144, experts=0),
    "qwen35moe-a3b": dict(arch="qwen35moe", hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256,
                          rope_dim=64, k_heads=16, v_heads=32, state=128, ffn=512, experts=32, used=8,
                          shared=512),
}


class _File:
    def __init__(self, path: Path, arch: str, seed: int) -> None:
        self.w = gguf.GGUFWriter(str(path), arch)
        self.rng = np.random.default_rng(seed)

    def matrix(self, name: str, rows: int, cols: int, n: int = 0) -> None:
        """A Q4_K matrix [rows, cols] (torch order), or n stacked experts of that shape."""
        if n:
            raw = random_kquant(Q, n * rows, cols, self.rng).reshape(n, rows, -1)
        else:
            raw = random_kquant(Q, rows, cols, self.rng)
        self.w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=Q)

    def f32(self, name: str, arr: np.ndarray) -> None:
        self.w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    def q8(self, name: str, arr: np.ndarray) -> None:
        raw = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        self.w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def echo_head(self, vocab: int, hidden: int, cycle_len: int) -> list[int]:
        """Embedding and LM head for ``--echo-cycle``: returns the cycle's token ids."""
        table = self.rng.standard_normal((vocab, hidden), dtype=np.float32) * ECHO_SCALE
        cycle = [int(t) for t in self.rng.choice(np.arange(1000, vocab - 1000), cycle_len, replace=False)]
        head = table.copy()
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            head[b] = table[a]                         # the head's row for b is a's embedding: a -> b
        self.q8("token_embd.weight", table)
        self.q8("output.weight", head)
        return cycle


def _copy_tokenizer(w: gguf.GGUFWriter, src: Path) -> int:
    """Copy the tokenizer.* keys of a real GGUF; returns its vocabulary size."""
    r = gguf.GGUFReader(str(src))
    n = 0
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
            n = max(n, len(value)) if key == "tokenizer.ggml.tokens" else n
        else:
            w.add_key_value(key, value, vtype)
    return n


def write(shape: str, out: Path, tokenizer_from: Path, seed: int = 0, experts: int | None = None,
          echo_cycle: int = 0) -> Path:
    s = dict(SHAPES[shape])
    if experts:
        s["experts"] = experts
    f = _File(out, s["arch"], seed)
    w = f.w
    vocab = _copy_tokenizer(w, tokenizer_from)
    h, layers = s["hidden"], s["layers"]
    kd, vd = s["k_heads"] * s["state"], s["v_heads"] * s["state"]
    w.add_block_count(layers)
    w.add_context_length(32768)
    w.add_embedding_length(h)
    if not s["experts"]:
        w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(s["rope_dim"])
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_ssm_conv_kernel(4)
    w.add_ssm_state_size(s["state"])
    w.add_ssm_group_count(s["k_heads"])
    w.add_ssm_time_step_rank(s["v_heads"])
    w.add_ssm_inner_size(vd)
    w.add_full_attention_interval(4)
    if s["experts"]:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["ffn"])
        w.add_expert_shared_feed_forward_length(s["shared"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    f.f32("output_norm.weight", np.ones(h))
    if echo_cycle:
        w.add_array(ECHO_KEY, f.echo_head(vocab, h, echo_cycle))
    else:
        f.matrix("token_embd.weight", vocab, h)
        f.matrix("output.weight", vocab, h)
    for i in range(layers):
        p = f"blk.{i}."
        f.f32(p + "attn_norm.weight", np.ones(h))
        f.f32(p + "post_attention_norm.weight", np.ones(h))
        if (i + 1) % 4:
            f.matrix(p + "attn_qkv.weight", 2 * kd + vd, h)
            f.matrix(p + "attn_gate.weight", vd, h)
            f.f32(p + "ssm_conv1d.weight", f.rng.normal(0, 0.3, (2 * kd + vd, 4)))
            f.f32(p + "ssm_dt.bias", f.rng.normal(-0.5, 0.3, s["v_heads"]))
            f.f32(p + "ssm_a", -f.rng.uniform(0.02, 0.3, s["v_heads"]))
            f.matrix(p + "ssm_beta.weight", s["v_heads"], h)
            f.matrix(p + "ssm_alpha.weight", s["v_heads"], h)
            f.f32(p + "ssm_norm.weight", np.ones(s["state"]))
            f.matrix(p + "ssm_out.weight", h, vd)
        else:
            d = s["head_dim"]
            f.matrix(p + "attn_q.weight", 2 * s["heads"] * d, h)
            f.matrix(p + "attn_k.weight", s["kv_heads"] * d, h)
            f.matrix(p + "attn_v.weight", s["kv_heads"] * d, h)
            f.matrix(p + "attn_output.weight", h, s["heads"] * d)
            f.f32(p + "attn_q_norm.weight", np.ones(d))
            f.f32(p + "attn_k_norm.weight", np.ones(d))
        if s["experts"]:
            e, ef = s["experts"], s["ffn"]
            f.f32(p + "ffn_gate_inp.weight", f.rng.normal(0, 0.02, (e, h)))
            f.matrix(p + "ffn_gate_exps.weight", ef, h, e)
            f.matrix(p + "ffn_up_exps.weight", ef, h, e)
            f.matrix(p + "ffn_down_exps.weight", h, ef, e)
            f.matrix(p + "ffn_gate_shexp.weight", s["shared"], h)
            f.matrix(p + "ffn_up_shexp.weight", s["shared"], h)
            f.matrix(p + "ffn_down_shexp.weight", h, s["shared"])
            f.f32(p + "ffn_gate_inp_shexp.weight", f.rng.normal(0, 0.02, h))
        else:
            f.matrix(p + "ffn_gate.weight", s["ffn"], h)
            f.matrix(p + "ffn_up.weight", s["ffn"], h)
            f.matrix(p + "ffn_down.weight", h, s["ffn"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer-from", type=Path, help="a GGUF whose vocabulary to copy (default: "
                    "the registry's qwen2.5-coder-0.5b-instruct)")
    ap.add_argument("--experts", type=int, help="experts per layer (qwen35moe-a3b; default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--echo-cycle", type=int, default=0, metavar="L",
                    help="embedding and head that continue a cycle of L tokens (for speculative decoding)")
    args = ap.parse_args(argv)
    src = args.tokenizer_from
    if src is None:
        from hitenter.models.registry import resolve_model

        src = Path(resolve_model("qwen2.5-coder-0.5b-instruct"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    path = write(args.shape, args.out, src, args.seed, args.experts, args.echo_cycle)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
