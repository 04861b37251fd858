"""Synthetic Gemma 4 GGUFs of realistic proportions, for running hitenter and llama.cpp on the same file.

    .venv/bin/python bench/synthetic_gemma4.py --shape e2b --out /work/models/gemma4-e2b-syn.gguf
    .venv/bin/python bench/synthetic_gemma4.py --shape a4b --experts 16 --out /work/models/gemma4-a4b-syn.gguf
    .venv/bin/python bench/vs_llamacpp.py --models /work/models/gemma4-e2b-syn.gguf --formats gguf

Shapes (llama.cpp's `gemma4` tensor names and metadata keys, as convert_hf_to_gguf's Gemma4Model writes them):

- ``e2b``: Gemma-4-E2B's proportions: hidden 1536, 35 layers (4 local : 1 global), 8 query heads, local
  layers 1 KV head of 256, global 1 KV head of 512 with K = V (no attn_v) and proportional RoPE over a
  quarter of the dims, the last 20 layers reading earlier layers' KV with a double-wide FFN (6144 / 12288),
  per-layer inputs of 256 (a 262144 x 8960 token table: the table the loader leaves on the map), window 512,
  final soft-cap 30.
- ``a4b``: Gemma-4-26B-A4B's per-token work (hidden 2816, 30 layers 5 local : 1 global, 16 heads, local 8 KV
  heads of 256, global 2 of 512 with K = V; each layer's dense GeGLU of 2112 beside top-8 experts of 704)
  with ``--experts`` experts per layer instead of 128, so the file fits this machine beside llama.cpp.

Weights: random but valid Q4_K blocks for every matrix (hitenter/testing/tiny_model.random_kquant), norms 1,
RoPE factors as the converter writes them; the vocabulary copied from llama.cpp's ggml-vocab-gemma-4.gguf
(hitenter.testing.llamacpp_vocab, tokenizer model "gemma4"). Random weights make the text meaningless; the
shapes, the bytes read per token and the work per token are the real model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_hybrid import _copy_tokenizer, _File  # noqa: E402

SHAPES = {
    "e2b": dict(hidden=1536, layers=35, period=5, heads=8, kv_swa=1, kv_full=1, head_swa=256, head_full=512,
                ffn=6144, shared_kv=20, per_layer=256, window=512, experts=0),
    "a4b": dict(hidden=2816, layers=30, period=6, heads=16, kv_swa=8, kv_full=2, head_swa=256, head_full=512,
                ffn=2112, shared_kv=0, per_layer=0, window=1024, experts=16, used=8, expert_ffn=704),
}


def write(shape: str, out: Path, seed: int = 0, experts: int | None = None) -> Path:
    from hitenter.testing.llamacpp_vocab import ensure_vocabs, vocab_path

    s = dict(SHAPES[shape])
    if experts:
        s["experts"] = experts
    ensure_vocabs()
    f = _File(out, "gemma4", seed)
    w = f.w
    vocab = _copy_tokenizer(w, vocab_path("gemma-4"))
    h, n, npl = s["hidden"], s["layers"], s["per_layer"]
    swa = [(i + 1) % s["period"] != 0 for i in range(n)]
    first_shared = n - s["shared_kv"]
    ffn = [s["ffn"] if i < first_shared else 2 * s["ffn"] for i in range(n)]
    w.add_block_count(n)
    w.add_context_length(32768)
    w.add_embedding_length(h)
    w.add_feed_forward_length(ffn)
    w.add_head_count(s["heads"])
    w.add_head_count_kv([s["kv_swa"] if x else s["kv_full"] for x in swa])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(s["head_full"])
    w.add_value_length(s["head_full"])
    w.add_key_length_swa(s["head_swa"])
    w.add_value_length_swa(s["head_swa"])
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_rope_dimension_count(s["head_full"])
    w.add_rope_dimension_count_swa(s["head_swa"])
    w.add_sliding_window(s["window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(s["shared_kv"])
    w.add_embedding_length_per_layer_input(npl)
    w.add_final_logit_softcapping(30.0)
    if s["experts"]:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    f.matrix("token_embd.weight", vocab, h)
    f.f32("output_norm.weight", np.ones(h))
    half, rot = s["head_full"] // 2, s["head_full"] // 8   # partial_rotary_factor 0.25: 1/4 of the pairs rotate
    f.f32("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (half - rot)))
    if npl:
        f.matrix("per_layer_token_embd.weight", vocab, npl * n)
        f.matrix("per_layer_model_proj.weight", npl * n, h)
        f.f32("per_layer_proj_norm.weight", np.ones(npl))
    for i in range(n):
        p = f"blk.{i}."
        d, kv = (s["head_swa"], s["kv_swa"]) if swa[i] else (s["head_full"], s["kv_full"])
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            f.f32(p + name + ".weight", np.ones(h))
        f.matrix(p + "attn_q.weight", s["heads"] * d, h)
        f.f32(p + "attn_q_norm.weight", np.ones(d))
        if i < first_shared:
            f.matrix(p + "attn_k.weight", kv * d, h)
            f.f32(p + "attn_k_norm.weight", np.ones(d))
            if swa[i]:   # the global layers: K = V
                f.matrix(p + "attn_v.weight", kv * d, h)
        f.matrix(p + "attn_output.weight", h, s["heads"] * d)
        f.matrix(p + "ffn_gate.weight", ffn[i], h)
        f.matrix(p + "ffn_up.weight", ffn[i], h)
        f.matrix(p + "ffn_down.weight", h, ffn[i])
        if npl:
            f.matrix(p + "inp_gate.weight", npl, h)
            f.matrix(p + "proj.weight", h, npl)
            f.f32(p + "post_norm.weight", np.ones(h))
        f.f32(p + "layer_output_scale.weight", np.ones(1))
        if s["experts"]:
            e, ef = s["experts"], s["expert_ffn"]
            f.f32(p + "ffn_gate_inp.weight", f.rng.normal(0, 0.02, (e, h)))
            f.f32(p + "ffn_gate_inp.scale", np.ones(h))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                f.f32(p + name + ".weight", np.ones(h))
            f.matrix(p + "ffn_gate_up_exps.weight", 2 * ef, h, e)
            f.matrix(p + "ffn_down_exps.weight", h, ef, e)
            f.f32(p + "ffn_down_exps.scale", np.ones(e))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experts", type=int, help="experts per layer (a4b; default 16)")
    a = ap.parse_args()
    print(write(a.shape, a.out, experts=a.experts))


if __name__ == "__main__":
    main()
