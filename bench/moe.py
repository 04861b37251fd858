"""Mixture-of-experts speed: one MoE layer alone (hitenter/models/moe.py), and a whole synthetic
Qwen3-MoE model against llama.cpp beside a dense Qwen3 of the same active size and a Qwen2 of that shape.

    .venv/bin/python bench/moe.py layer [--rounds 7] [--threads 2]
    .venv/bin/python bench/moe.py model [--dir /tmp/hitenter-moe-bench] [--rounds 5]
        [--llamacpp-python /work/venvs/llamacpp/bin/python] [--threads 2]

layer: MoEFFN at Qwen3-MoE-like proportions (hidden 1024, 64 experts of ffn 768, top-8, Q4_K random
valid blocks) at T = 1 (a decode step) and T = 512 (a prefill chunk): hitenter's grouped layer (bytes
owned by the arena as a loaded model's are, gate+up one qmatmul per expert), the same on the file's
bytes (gate and up two calls), a per-expert dequantize + fp32 matmul baseline (the plain-torch way on
GGUF blocks) and, at T = 1, the bandwidth the active experts' bytes imply.
model: writes (once, cached in --dir) a synthetic qwen3moe GGUF (16 layers, hidden 1024, 64 experts of
768, top-8, 16 heads / 4 KV heads of 64 with attn_q_norm / attn_k_norm; llama.cpp's tensor names and
keys, as convert_hf_to_gguf writes them) and a dense qwen3 GGUF of the same active size (ffn 8 x 768),
and a qwen2 GGUF of the dense shape (no QK-norm; Q/K/V biases): "dense Qwen3 as fast as the same-size
Qwen2". All matrices Q4_K; then times decode (batch 1, 64 tokens) and prefill (512 tokens) in hitenter
(`hitenter.LLM(path)`) and llama.cpp (llama-cpp-python in its own venv), each a persistent worker
process, alternating rounds; medians and ratios. A file hitenter cannot load yet is reported as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import baseline_env, cpu_line  # noqa: E402

SHAPE = {"layers": 16, "hidden": 1024, "experts": 64, "expert_ffn": 768, "top_k": 8, "heads": 16,
         "kv_heads": 4, "head_dim": 64, "context": 4096}
PREFILL, DECODE = 512, 64


# ---- machine facts --------------------------------------------------------------------------------------

def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in samples.items()}


# ---- the layer alone ------------------------------------------------------------------------------------

def random_experts(n_expert: int, out: int, inp: int, seed: int) -> Any:
    import gguf
    import numpy as np
    import torch

    from hitenter.kernels import BlockWeight
    from hitenter.models.moe import ExpertWeight
    from hitenter.testing.tiny_model import random_kquant

    q = gguf.GGMLQuantizationType.Q4_K
    raw = random_kquant(q, n_expert * out, inp, np.random.default_rng(seed))
    return ExpertWeight(n_expert, out, inp, blocks=BlockWeight(torch.from_numpy(raw), int(q), (n_expert * out, inp)))


def dequant_baseline(m: Any, gate: Any, up: Any, down: Any, x: Any) -> Any:
    """Per active expert: dequantize its three matrices (gguf's dequantizer), fp32 matmuls; weighted sum."""
    import torch
    from torch.nn import functional as F

    idx, w = m.route(x)
    y = torch.zeros_like(x)
    for e in idx.unique().tolist():
        t, r = (idx == e).nonzero(as_tuple=True)
        xe = x[t]
        h = F.silu(xe @ gate.expert(e).dequantize().t()) * (xe @ up.expert(e).dequantize().t())
        y.index_add_(0, t, (h @ down.expert(e).dequantize().t()) * w[t, r].unsqueeze(1))
    return y


def layer_bench(a: argparse.Namespace) -> None:
    import torch
    from torch import nn

    from hitenter.models.block_linear import own_block_bytes
    from hitenter.models.moe import MoEFFN

    torch.set_num_threads(a.threads)
    s = SHAPE
    e, h, f, k = s["experts"], s["hidden"], s["expert_ffn"], s["top_k"]
    gate, up, down = (random_experts(e, f, h, 1), random_experts(e, f, h, 2), random_experts(e, h, f, 3))
    router = torch.randn(e, h, generator=torch.Generator().manual_seed(0)) * 0.05
    file_bytes = MoEFFN(router, gate, up, down, k, True)
    owned = MoEFFN(router, gate, up, down, k, True)
    holder = nn.Module()
    holder.ffn = owned
    own_block_bytes(holder)   # what the loader does: the arena copy, gate+up adjacent -> one qmatmul
    expert_bytes = gate.blocks.nbytes() // e + up.blocks.nbytes() // e + down.blocks.nbytes() // e
    print(cpu_line(), f"| torch threads {torch.get_num_threads()}")
    print(f"MoE layer: hidden {h}, {e} experts of ffn {f}, top-{k}, Q4_K; {expert_bytes / 1e6:.2f} MB per expert")
    for t in (1, PREFILL):
        # T = 1: a different row each call (other experts: their bytes come from DRAM, as in a model whose
        # 16 layers' experts never fit a cache); T = 512: one batch, every expert active
        xs = torch.randn(32 if t == 1 else 1, t, h, generator=torch.Generator().manual_seed(t))
        active = statistics.mean(len(owned.route(x)[0].unique()) for x in xs)
        variants = {"hitenter grouped, owned (gate+up fused)": owned,
                    "hitenter grouped, file bytes (gate, up)": file_bytes,
                    "per-expert dequantize + fp32 matmul": lambda x: dequant_baseline(owned, gate, up, down, x)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        with torch.inference_mode():
            for fn in variants.values():
                fn(xs[0])                              # warm-up (and the kernel library's first load)
            for r in range(a.rounds if t == 1 else max(3, a.rounds // 2)):
                for name, fn in variants.items():    # alternating rounds
                    reps = 16 if t == 1 and "hitenter" in name else 1
                    t0 = time.perf_counter()
                    for i in range(reps):
                        fn(xs[(r * reps + i) % len(xs)])
                    times[name].append((time.perf_counter() - t0) / reps)
        med = medians(times)
        base = med["per-expert dequantize + fp32 matmul"]
        print(f"\nT = {t} ({active:.0f} experts active, {active * expert_bytes / 1e6:.1f} MB of expert weights)")
        for name, sec in med.items():
            extra = f", {active * expert_bytes / sec / 1e9:.1f} GB/s of expert bytes" if t == 1 else ""
            print(f"  {name:42s} {sec * 1e3:9.2f} ms  {t / sec:9.0f} tok/s  {base / sec:6.1f}x baseline{extra}")
        one = med["hitenter grouped, owned (gate+up fused)"]
        print(f"  x {s['layers']} layers: {one * s['layers'] * 1e3:.1f} ms of MoE FFN per step")


# ---- synthetic GGUFs ------------------------------------------------------------------------------------

def write_model(path: Path, arch: str, seed: int = 0) -> Path:
    """A qwen3moe, qwen3 (dense, ffn = top_k x expert_ffn) or qwen2 (the dense shape without QK-norm, with
    Q/K/V biases) GGUF with llama.cpp's names and keys; every matrix Q4_K (random valid blocks, a few
    distinct arrays reused across layers to bound memory)."""
    import gguf
    import numpy as np

    from hitenter.testing.tiny_model import add_tokenizer, random_kquant

    s = SHAPE
    moe = arch == "qwen3moe"
    h, d, nh, nkv = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"]
    ffn = s["expert_ffn"] if moe else s["expert_ffn"] * s["top_k"]
    rng = np.random.default_rng(seed)
    q4k = gguf.GGMLQuantizationType.Q4_K
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic-{arch}")
    w.add_block_count(s["layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(s["expert_ffn"] * s["top_k"])   # HF intermediate_size (dense FFN width)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if moe:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["top_k"])
        w.add_expert_feed_forward_length(ffn)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    vocab = add_tokenizer(w)
    pools: dict[tuple[int, ...], list[np.ndarray]] = {}
    uses: dict[tuple[int, ...], int] = {}

    def blocks(*shape: int) -> np.ndarray:   # [..., rows, cols] of Q4_K: up to 3 distinct arrays per shape
        pool = pools.setdefault(shape, [])
        uses[shape] = uses.get(shape, 0) + 1
        if len(pool) < 3:
            pool.append(random_kquant(q4k, int(np.prod(shape[:-1])), shape[-1], rng).reshape(*shape[:-1], -1))
        return pool[(uses[shape] - 1) % 3]

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", blocks(vocab, h), raw_dtype=q4k)
    w.add_tensor("output_norm.weight", norm(h))
    w.add_tensor("output.weight", blocks(vocab, h), raw_dtype=q4k)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        w.add_tensor(p + "attn_q.weight", blocks(nh * d, h), raw_dtype=q4k)
        w.add_tensor(p + "attn_k.weight", blocks(nkv * d, h), raw_dtype=q4k)
        w.add_tensor(p + "attn_v.weight", blocks(nkv * d, h), raw_dtype=q4k)
        w.add_tensor(p + "attn_output.weight", blocks(h, nh * d), raw_dtype=q4k)
        if arch == "qwen2":
            for name, n in (("attn_q", nh * d), ("attn_k", nkv * d), ("attn_v", nkv * d)):
                w.add_tensor(p + name + ".bias", (rng.standard_normal(n) * 0.05).astype(np.float32))
        else:
            w.add_tensor(p + "attn_q_norm.weight", norm(d))
            w.add_tensor(p + "attn_k_norm.weight", norm(d))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        if moe:   # ggml ne [in, out, E]: numpy [E, out, in bytes]; the router stays F32 as llama.cpp keeps it
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((s["experts"], h)) * 0.05).astype(np.float32))
            w.add_tensor(p + "ffn_gate_exps.weight", blocks(s["experts"], ffn, h), raw_dtype=q4k)
            w.add_tensor(p + "ffn_up_exps.weight", blocks(s["experts"], ffn, h), raw_dtype=q4k)
            w.add_tensor(p + "ffn_down_exps.weight", blocks(s["experts"], h, ffn), raw_dtype=q4k)
        else:
            w.add_tensor(p + "ffn_gate.weight", blocks(ffn, h), raw_dtype=q4k)
            w.add_tensor(p + "ffn_up.weight", blocks(ffn, h), raw_dtype=q4k)
            w.add_tensor(p + "ffn_down.weight", blocks(h, ffn), raw_dtype=q4k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- workers: one persistent process per engine, one JSON line per request --------------------------------

def prompt(n: int, vocab: int) -> list[int]:
    return [3 + (i * 7919) % (vocab - 3) for i in range(n)]   # past the 3 special tokens


def hitenter_worker(path: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from hitenter import LLM, SamplingParams

    try:
        llm = LLM(path, enable_prefix_caching=False, max_model_len=2048, max_num_batched_tokens=PREFILL)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which goes on without hitenter
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    vocab = llm.engine.parts.model.config.vocab_size
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "prefill":
            t0 = time.perf_counter()
            llm.generate([prompt(req["n"], vocab)], SamplingParams(temperature=0, max_tokens=1))
            rate = req["n"] / (time.perf_counter() - t0)
        else:
            stamps: list[float] = []
            llm.generate([prompt(16, vocab)], SamplingParams(temperature=0, max_tokens=req["n"] + 1, ignore_eos=True),
                         on_output=lambda o, s=stamps: s.append(time.perf_counter()))
            rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        print(json.dumps({"tok_s": rate}), flush=True)


def llamacpp_worker(path: str, threads: int) -> None:
    """Runs under the llama-cpp-python venv's interpreter (no torch, no hitenter there)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_batch=PREFILL, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    vocab = llm.n_vocab()
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        llm.reset()
        if req["op"] == "prefill":
            t0 = time.perf_counter()
            llm.eval(prompt(req["n"], vocab))
            rate = req["n"] / (time.perf_counter() - t0)
        else:
            llm.eval(prompt(16, vocab))
            t0 = time.perf_counter()
            for i in range(req["n"]):
                llm.eval([3 + i])
            rate = req["n"] / (time.perf_counter() - t0)
        print(json.dumps({"tok_s": rate}), flush=True)


class Worker:
    """A worker subprocess (this file with --worker ENGINE): ask(op, n) -> tokens/s."""

    def __init__(self, python: str, engine: str, path: Path, threads: int) -> None:
        self.proc = subprocess.Popen([python, __file__, "--worker", engine, str(path), "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=None if engine == "hitenter" else baseline_env())
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": f"worker exited ({self.proc.wait()})"}

    def ask(self, op: str, n: int) -> float:
        self.proc.stdin.write(json.dumps({"op": op, "n": n}) + "\n")
        self.proc.stdin.flush()
        return float(self._read()["tok_s"])

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def model_bench(a: argparse.Namespace) -> None:
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-".join(str(v) for v in SHAPE.values())
    files = {kind: out / f"{kind}-{tag}.gguf" for kind in ("qwen3moe", "qwen3", "qwen2")}
    for kind, path in files.items():
        if not path.exists():
            t0 = time.perf_counter()
            write_model(path.with_suffix(".tmp"), kind).rename(path)
            print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s")
    print(cpu_line(), f"| {a.threads} threads")
    for kind, path in files.items():
        workers = {"hitenter": Worker(sys.executable, "hitenter", path, a.threads)}
        if Path(a.llamacpp_python).exists():
            workers["llama.cpp"] = Worker(a.llamacpp_python, "llama.cpp", path, a.threads)
        for name, wk in list(workers.items()):
            if "error" in wk.hello:
                print(f"{kind}: {name} cannot run it: {wk.hello['error']}")
                wk.close()
                del workers[name]
        samples: dict[str, list[float]] = {f"{n} {op}": [] for n in workers for op in ("decode", "prefill")}
        for r in range(a.rounds + 1):   # round 0 warms up; engines alternate within each round
            for op, n in (("decode", DECODE), ("prefill", PREFILL)):
                for name, wk in workers.items():
                    rate = wk.ask(op, n)
                    if r:
                        samples[f"{name} {op}"].append(rate)
        for wk in workers.values():
            wk.close()
        med = medians({k: v for k, v in samples.items() if v})
        print(f"\n== {kind} ({path.stat().st_size / 1e6:.0f} MB): medians of {a.rounds} rounds, tokens/s")
        for op, n in (("decode", DECODE), ("prefill", PREFILL)):
            ours, theirs = med.get(f"hitenter {op}"), med.get(f"llama.cpp {op}")
            ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
            fmt = lambda v: f"{v:8.1f}" if v else "       -"  # noqa: E731
            print(f"  {op} ({n} tokens): hitenter {fmt(ours)}  llama.cpp {fmt(theirs)}  ratio {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["layer", "model"], default="layer")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/hitenter-moe-bench")
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        (hitenter_worker if a.worker[0] == "hitenter" else llamacpp_worker)(a.worker[1], a.threads)
    elif a.what == "layer":
        layer_bench(a)
    else:
        model_bench(a)


if __name__ == "__main__":
    main()
