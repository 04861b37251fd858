"""Speculative decoding with the file's own MTP block (--speculative-method mtp) against plain decoding, batch-1
greedy, on the synthetic Qwen3.5-2B-shaped file (bench/synthetic_hybrid.py) with an MTP block appended.

    .venv/bin/python bench/mtp_decode.py [--base /work/models/qwen35-2b-syn.gguf] [--dir /work/models]
        [--variants random copy] [--k 3] [--max-tokens 64] [--rounds 3]

Variants (each a copy of the base file plus ``blk.{n}``, an MTP block of Qwen3.5-2B's shape: a gated
attention layer 8 x 256 with 2 KV heads, a 6144-wide SwiGLU FFN, nextn.eh_proj [2048, 4096], all Q4_K):

- ``random``: random MTP weights, the trunk as it is. Drafts are (almost) never accepted: this measures the
  cost of drafting. "mtp K" drafts K tokens every step (HITENTER_SPEC_ADAPTIVE=0): its slowdown is the
  draft steps' cost plus the verification pass over K + 1 rows; "mtp adaptive" (the default) stops drafting
  once it sees no acceptance and probes now and then. "full head" scores the whole vocabulary
  (HITENTER_DRAFT_VOCAB=0), "head[:32768]" the default trimmed head (engine/speculative/draft_head.py).
- ``copy`` (a synthetic best case, not a real model's acceptance): the trunk's output projections (ssm_out,
  attn_output, ffn_down) are zero blocks, so its prediction depends on the current token only (all layers
  still run: the same work per token), and the MTP block reproduces that prediction (eh_proj = [I | 0] in
  Q8_0, its attention and FFN outputs zero, norms 1): every greedy draft is accepted. This shows what the
  mechanism gains when the head predicts well (real Qwen3.5 MTP heads are reported to accept ~60-80%).
  With the trimmed head, drafts can only be ids below 32768: on this random vocabulary most of the trunk's
  predictions lie above, so only the full-head rows show the mechanism here (on real text the frequent
  tokens have the low ids).

Figures: medians over rounds that alternate the configurations (all engines loaded once, one sequence, prefix
caching off): decode tok/s after the first token (wall), CPU ms per token, acceptance, tokens per
verification step, and whether the tokens equal plain decoding's; the machine's load average beside them
(other engineers share these cores); for the adaptive configuration, its measured costs: a proposal of
n MTP steps (the first includes the catch-up rows of the tokens verified since the last proposal) and the
target's pass over r rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, emit_json, table  # noqa: E402

from hitenter.testing.tiny_model import random_kquant  # noqa: E402

Q4K, Q8 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0
ZEROED = ("ssm_out.weight", "attn_output.weight", "ffn_down.weight")
PROMPTS = ["Write a Python function that parses a CSV file and returns the rows as dictionaries.",
           "Explain how a hash map handles collisions, with an example."]


def _meta(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def _zero_blocks(t: Any) -> np.ndarray:
    return np.zeros_like(np.asarray(t.data))


def with_mtp(base: Path, out: Path, copy: bool, seed: int = 0) -> Path:
    """`base` (a qwen35 file without MTP) rewritten to `out` with an MTP block appended (module docstring)."""
    r = gguf.GGUFReader(str(base))
    arch = _meta(r, "general.architecture")
    if arch != "qwen35" or f"{arch}.nextn_predict_layers" in r.fields:
        raise SystemExit(f"{base}: need a dense qwen35 file without an MTP block, got {arch}")
    n = int(_meta(r, f"{arch}.block_count"))
    w = gguf.GGUFWriter(str(out), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", f"{arch}.block_count"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    w.add_block_count(n + 1)
    w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    for t in r.tensors:
        data = _zero_blocks(t) if copy and t.name.endswith(ZEROED) else np.asarray(t.data)
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    h, ffn = int(_meta(r, f"{arch}.embedding_length")), int(_meta(r, f"{arch}.feed_forward_length"))
    heads, kvh, d = (int(_meta(r, f"{arch}.{k}")) for k in ("attention.head_count", "attention.head_count_kv",
                                                              "attention.key_length"))
    rng = np.random.default_rng(seed)

    def q4k(name: str, rows: int, cols: int, zero: bool = False) -> None:
        raw = random_kquant(Q4K, rows, cols, rng)
        raw = np.zeros_like(raw) if zero else raw
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=Q4K)

    def ones(name: str, size: int) -> None:
        w.add_tensor(name, np.ones(size, dtype=np.float32))

    p = f"blk.{n}."
    ones(p + "attn_norm.weight", h)
    ones(p + "post_attention_norm.weight", h)
    q4k(p + "attn_q.weight", 2 * heads * d, h)
    q4k(p + "attn_k.weight", kvh * d, h)
    q4k(p + "attn_v.weight", kvh * d, h)
    q4k(p + "attn_output.weight", h, heads * d, zero=copy)
    ones(p + "attn_q_norm.weight", d)
    ones(p + "attn_k_norm.weight", d)
    q4k(p + "ffn_gate.weight", ffn, h)
    q4k(p + "ffn_up.weight", ffn, h)
    q4k(p + "ffn_down.weight", h, ffn, zero=copy)
    if copy:   # the token half only
        raw = gguf.quants.quantize(np.eye(h, 2 * h, dtype=np.float32), Q8)
        w.add_tensor(p + "nextn.eh_proj.weight", raw, raw_shape=raw.shape, raw_dtype=Q8)
    else:
        q4k(p + "nextn.eh_proj.weight", h, 2 * h)
    for name in ("enorm", "hnorm", "shared_head_norm"):
        ones(p + f"nextn.{name}.weight", h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


HEADER = ["file", "config", "decode tok/s", "speedup", "cpu ms/tok", "cpu speedup", "accept rate", "tokens/step",
          "same"]


def build(path: str, opts: dict[str, Any], env: dict[str, str]) -> Any:
    """An LLM with `env` set while it is built (the speculative knobs are read then)."""
    from hitenter import LLM

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return LLM(path, max_model_len=1024, max_num_seqs=1, enable_prefix_caching=False, **opts)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(llm: Any, max_tokens: int) -> dict[str, Any]:
    """The prompts one after another: tokens, decode wall / CPU seconds and tokens, speculation counters."""
    from hitenter import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    res: dict[str, Any] = {"tokens": [], "wall": 0.0, "cpu": 0.0, "n": 0, "drafted": 0, "accepted": 0, "steps": 0}
    for prompt in PROMPTS:
        marks: list[tuple[float, float]] = []
        out = llm.chat([{"role": "user", "content": prompt}], sp,
                       on_output=lambda o, m=marks: m.append((time.perf_counter(), time.process_time())))[0]
        res["tokens"].append(out.outputs[0].token_ids)
        res["wall"] += marks[-1][0] - marks[0][0]
        res["cpu"] += marks[-1][1] - marks[0][1]
        res["n"] += len(out.outputs[0].token_ids) - 1
        st = out.extra.get("spec_decode", {})
        for key, name in (("drafted", "num_draft_tokens"), ("accepted", "num_accepted_tokens"),
                          ("steps", "num_verify_steps")):
            res[key] += st.get(name, 0)
    return res


def bench(name: str, path: str, configs: list[tuple[str, dict[str, Any], dict[str, str]]], max_tokens: int,
          rounds: int) -> list[list[Any]]:
    llms = [(label, build(path, o, e)) for label, o, e in configs]
    for _, llm in llms:
        run(llm, 4)   # warm-up
    got: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in llms}
    for _ in range(rounds):
        for label, llm in llms:
            got[label].append(run(llm, max_tokens))
    base = got[configs[0][0]]
    rate0 = statistics.median(x["n"] / x["wall"] for x in base)
    cpu0 = statistics.median(x["cpu"] / x["n"] for x in base)
    rows = []
    for label, _ in llms:
        xs = got[label]
        rate, cpu = statistics.median(x["n"] / x["wall"] for x in xs), statistics.median(x["cpu"] / x["n"] for x in xs)
        d, a, s = (sum(x[k] for x in xs) for k in ("drafted", "accepted", "steps"))
        same = all(x["tokens"] == base[0]["tokens"] for x in xs)
        rows.append([name, label, round(rate, 2), round(rate / rate0, 3), round(1e3 * cpu, 1), round(cpu0 / cpu, 3),
                     round(a / d, 3) if d else "-", round((a + s) / s, 2) if s else "-", "yes" if same else "NO"])
    print(table(rows, HEADER), flush=True)
    for label, llm in llms:   # the adaptive controller's measured costs (EMA seconds, hitenter/engine/speculative)
        ad = getattr(llm.engine.spec, "adaptive", None) if llm.engine.spec is not None else None
        if ad is not None and ad.costs.drafts and ad.costs.rows:
            drafts = ", ".join(f"{k} steps {1e3 * v:.1f} ms" for k, v in sorted(ad.costs.drafts.items()))
            passes = ", ".join(f"{k} rows {1e3 * v:.1f} ms" for k, v in sorted(ad.costs.rows.items()))
            print(f"{label}: MTP proposals {drafts}; target passes {passes}", flush=True)
    del llms
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, default=Path("/work/models/qwen35-2b-syn.gguf"),
                    help="a qwen35 file from bench/synthetic_hybrid.py --shape qwen35-2b")
    ap.add_argument("--dir", type=Path, default=Path("/work/models"), help="where the MTP copies are written")
    ap.add_argument("--variants", nargs="+", choices=["random", "copy"], default=["random", "copy"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.num_threads)
    if not args.base.exists():
        raise SystemExit(f"{args.base} missing: write it with bench/synthetic_hybrid.py --shape qwen35-2b")
    print(cpu_line())
    results = {}
    for variant in args.variants:
        path = args.dir / f"{args.base.stem}-mtp-{variant}.gguf"
        if not path.exists():
            with_mtp(args.base, path, variant == "copy")
        mtp = {"speculative_method": "mtp", "num_speculative_tokens": args.k}
        configs = [("none", {}, {}),
                   (f"mtp K={args.k} full head", mtp, {"HITENTER_SPEC_ADAPTIVE": "0", "HITENTER_DRAFT_VOCAB": "0"}),
                   (f"mtp K={args.k} head[:32768]", mtp, {"HITENTER_SPEC_ADAPTIVE": "0"}),
                   ("mtp adaptive full head", mtp, {"HITENTER_DRAFT_VOCAB": "0"}),
                   ("mtp adaptive head[:32768]", mtp, {})]
        load0 = os.getloadavg()[0]
        rows = bench(f"qwen35-2b {variant}", str(path), configs, args.max_tokens, args.rounds)
        print(f"load average (1 min): {load0:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
        results[variant] = rows
    emit_json("mtp_decode", {"rows": results, "k": args.k, "max_tokens": args.max_tokens, "rounds": args.rounds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
