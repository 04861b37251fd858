"""torch.compile (Inductor, CPU) on the decode step, beside the eager step, in one run (issue 7 part 2).

    .venv/bin/python bench/compile_decode.py [--batch 1] [--tokens 128] [--rounds 3] [--threads 2]

SmolLM2 with int4 weights (the fastest batch-1 format). Each layer's work outside attention (RMSNorm,
fused Q/K/V int4 GEMM, RoPE; o_proj, residual, RMSNorm, gate/up, SiLU x up, down, residual) runs either
eager or as two functions compiled by Inductor, which fuses the elementwise ops into C++ kernels and
calls the int4 GEMM as an extern kernel; the paged attention between them stays eager (its work plan
is Python). Weights are passed as tensors, so the 30 layers share one compiled graph per function.
Modes alternate within each round (eager, compiled static shapes, compiled dynamic shapes); the table
gives the median decode tokens/s and the ratio to eager, plus the one-time compile seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402


def _int4(x: Any, packed: Any, saz: Any, n: int) -> Any:
    import torch

    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16).contiguous(), packed, 32, saz)
    return y[:, :n].to(x.dtype)


def _pre(x: Any, nw: Any, eps: float, packed: Any, saz: Any, n: int, cos: Any, sin: Any, qk_size: int,
         d: int) -> tuple[Any, Any]:
    """attn_norm -> fused QKV -> RoPE on Q and K heads; returns (rotated Q+K heads, V heads)."""
    import torch
    from torch.nn import functional as F

    qkv = _int4(F.rms_norm(x, (x.shape[-1],), nw, eps), packed, saz, n)
    t = qkv.shape[0]
    qk = qkv[:, :qk_size].view(t, -1, d)
    rot = torch.cat([-qk[..., d // 2:], qk[..., :d // 2]], dim=-1)
    return qk * cos + rot * sin, qkv[:, qk_size:].view(t, -1, d)


def _post(x: Any, o: Any, layer_bufs: tuple[Any, ...], nw: Any, eps: float) -> Any:
    """x + o_proj(o), then x + down(silu(gate) * up) of ffn_norm(x)."""
    from torch.nn import functional as F

    po, so, no, pgu, sgu, ngu, pd, sd, nd = layer_bufs
    x = x + _int4(o, po, so, no)
    gate, up = _int4(F.rms_norm(x, (x.shape[-1],), nw, eps), pgu, sgu, ngu).chunk(2, dim=-1)
    return x + _int4(F.silu(gate) * up, pd, sd, nd)


def make_forward(pre: Any, post: Any) -> Any:
    """A DecoderLayer.forward (same contract as hitenter/models/decoder.py) built on `pre` and `post`."""
    from hitenter.models.attention import paged_attention, write_kv

    def forward(self: Any, x: Any, rope: Any, cos_sin: Any, attn: Any, kv_cache: Any, n_real: int) -> Any:
        if n_real != x.shape[0]:
            raise RuntimeError("compile_decode: int4 models are not row padded")
        qk, v = pre(x, self.attn_norm.weight, self.attn_norm.eps, self.qkv.packed, self.qkv.scales_and_zeros,
                    self.qkv.out_features, cos_sin[0], cos_sin[1], self.q_size + self.kv_size, self.cfg.head_dim)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        write_kv(kv_cache, k, v, attn.slot_mapping)
        o = paged_attention(q, kv_cache, attn, self.scale, self.attn_row_multiple).view(n_real, -1)
        bufs = tuple(t for m in (self.o_proj, self.gate_up, self.down)
                     for t in (m.packed, m.scales_and_zeros, m.out_features))
        return post(x, o, bufs, self.ffn_norm.weight, self.ffn_norm.eps)

    return forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    from hitenter import LLM, SamplingParams
    from hitenter.models import llama
    from hitenter.models.registry import resolve_model

    torch.set_num_threads(a.threads)
    eager_forward = llama.DecoderLayer.forward
    modes = {"eager": eager_forward, "manual split (eager)": make_forward(_pre, _post),
             "compiled, static shapes": make_forward(torch.compile(_pre, dynamic=False),
                                                     torch.compile(_post, dynamic=False)),
             "compiled, dynamic shapes": make_forward(torch.compile(_pre, dynamic=True),
                                                      torch.compile(_post, dynamic=True))}
    llm = LLM(str(resolve_model(a.model)), quantization="int4", enable_prefix_caching=False)
    prompts = [list(range(100 + i, 116 + i)) for i in range(a.batch)]

    def decode_rate(n: int) -> float:
        stamps: list[float] = []
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                     on_output=lambda _o: stamps.append(time.perf_counter()))
        steps = len(stamps) / a.batch - 1   # the first output of each request ends its prefill
        return a.batch * steps / (stamps[-1] - stamps[0])

    rates: dict[str, list[float]] = {m: [] for m in modes}
    warm_s: dict[str, float] = {}
    try:
        for name, fwd in modes.items():   # first call compiles; timed apart from the rates
            llama.DecoderLayer.forward = fwd
            t0 = time.perf_counter()
            decode_rate(4)
            warm_s[name] = time.perf_counter() - t0
        for _ in range(a.rounds):
            for name, fwd in modes.items():
                llama.DecoderLayer.forward = fwd
                rates[name].append(decode_rate(a.tokens))
    finally:
        llama.DecoderLayer.forward = eager_forward
        llm.close()
    med = {m: statistics.median(r) for m, r in rates.items()}
    rows = [[m, med[m], med[m] / med["eager"], warm_s[m], " ".join(f"{r:.1f}" for r in rates[m])] for m in modes]
    print(f"decode, batch {a.batch}, int4, {a.threads} threads, {a.rounds} rounds (modes alternate)")
    print(table(rows, ["mode", "tok/s", "x eager", "first call s", "per round"]))
    emit_json("compile_decode", {"batch": a.batch, "tok_s": med, "first_call_s": warm_s})


if __name__ == "__main__":
    main()
