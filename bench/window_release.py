"""KV blocks one Gemma 3 request holds at long context, with the local layers releasing the blocks outside
their window (hitenter/kv_cache/window_group.py) and with one table for all layers (HITENTER_WINDOW_RELEASE=0),
in the same run; and whether the greedy tokens are the same. Counts are layer-blocks (block x layer), so they
are memory: bytes = layer-blocks x block_size x 2 x kv_heads x head_dim x element bytes.

    .venv/bin/python bench/window_release.py [--model PATH] [--tokens 8192] [--new 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from pathlib import Path

from hitenter.kv_cache.manager import KVCacheManager
from hitenter.request import Request


def run(model: str, release: bool, prompt: list[int], new: int) -> tuple[list[int], int, int, int, float]:
    """(tokens, global blocks, local blocks held at the end, pool sizes) for one request."""
    from hitenter import LLM, SamplingParams

    os.environ["HITENTER_WINDOW_RELEASE"] = "1" if release else "0"
    last: list[tuple[int, int]] = [(0, 0)]
    orig = KVCacheManager.cache_blocks

    def record(self: KVCacheManager, r: Request, n: int) -> None:
        orig(self, r, n)
        last[0] = self.held_blocks(r.request_id)

    KVCacheManager.cache_blocks = record   # type: ignore[method-assign]
    try:
        llm = LLM(model, max_model_len=len(prompt) + new + 16, max_num_seqs=4)
        cfg = llm.model_config
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
        dt = time.perf_counter() - t0
        n_local = sum(cfg.layer_window(i) is not None for i in range(cfg.num_layers))
        g, loc = last[0]
        held = (cfg.num_layers - n_local) * g + n_local * (loc if release else g)
        pools = llm.engine.kv_manager.num_blocks
        llm.close()
        return list(out[0].outputs[0].token_ids), g, held, pools, dt
    finally:
        KVCacheManager.cache_blocks = orig   # type: ignore[method-assign]


def cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    isa = "+".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16") if f in flags)
    return f"{name} ({isa})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path.home() / ".cache/hitenter/models/gemma-3-270m.gguf"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--new", type=int, default=16)
    a = ap.parse_args()
    rng = random.Random(0)
    prompt = [rng.randrange(100, 20000) for _ in range(a.tokens - a.new)]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; model {a.model}")
    off = run(a.model, False, prompt, a.new)
    on = run(a.model, True, prompt, a.new)
    for name, r in (("one table", off), ("release", on)):
        print(f"{name:10s} context {a.tokens}: {r[2]} layer-blocks held ({r[1]} global blocks), "
              f"global pool {r[3]} blocks, {r[4]:.1f} s")
    print(f"held with release / one table: {on[2] / off[2]:.3f}; tokens identical: {on[0] == off[0]}")


if __name__ == "__main__":
    main()
