"""A disaggregated-prefill worker process (rank 1): computes prompts' KV blocks and sends them to rank 0.

Started by `hitenter.distributed.disagg.launch` as `python -m hitenter.distributed.disagg_worker`,
its arguments pickled on stdin (the same life cycle as the tensor-parallel worker, worker.py):
  1. load the whole model (no sharding) and a scratch KV cache of `ceil(max_model_len / block_size)`
     blocks, report ("ready", rank) or ("error", rank, traceback) on the control pipe;
  2. join the gloo group (rank 1 of 2), then loop, one job at a time, in arrival order:
       recv  header int64 [job, n]  (tag 0; job < 0 means stop)
       recv  token ids int64 [n]    (tag 1)
       run the n tokens through the model in chunks of `chunk` tokens (blocks 0..nb-1 of the scratch
       cache, slot = position), no LM head;
       send  KV float [L, 2, nb, block_size, kv_heads, head_dim]   (tag 2 + 2*job)
       send  timings float64 [prefill_s, send_s]                    (tag 3 + 2*job)
A failure is reported on the control pipe and ends the process (rank 0 turns it into an error for the
requests in flight); a watchdog exits when rank 0 (the parent) is gone.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

import torch
from torch import distributed as dist

from hitenter.distributed.worker import WORKER_TIMEOUT, _watch_parent, run_worker, serving

HEADER_TAG = 0
IDS_TAG = 1


def kv_tag(job: int) -> int:
    return 2 + 2 * job


def timing_tag(job: int) -> int:
    return 3 + 2 * job


def prefill_kv(model: Any, ids: torch.Tensor, kv_caches: list[torch.Tensor], block_size: int,
               chunk: int) -> torch.Tensor:
    """KV of `ids` (a prompt of n + 1 tokens but its last) computed into scratch blocks 0..nb-1
    (hitenter/models/prompt_kv.py); returns them stacked `[L, 2, kv_heads, nb, block_size, head_dim]` (a copy)."""
    from hitenter.models.prompt_kv import prefill_kv as compute

    compute(model, ids, kv_caches, block_size, chunk)
    nb = -(-ids.numel() // block_size)
    return torch.stack([kv[:, :, :nb] for kv in kv_caches])


def prefill_worker_main(rank: int, port: int, path: str, dtype: torch.dtype, num_threads: int, block_size: int,
                        max_model_len: int, chunk: int, batch_invariant: bool, ctrl: Any, parent_pid: int,
                        weight_format: str = "dense", kv_dtype: torch.dtype | None = None) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(num_threads)
    try:
        from hitenter.models.attention import allocate_kv_caches
        from hitenter.models.loader import load_model

        # the decoding engine's weight format (dense in `dtype`, or the GGUF's blocks), so the KV it ships
        # is what that engine would have computed
        model, cfg = load_model(path, dtype=dtype, quantization="gguf" if weight_format == "gguf" else None)
        model.eval()
        if hasattr(model, "batch_invariant"):
            model.batch_invariant = batch_invariant
        # the decoding engine's cache elements, so the KV shipped is bitwise what it would have written
        kv_caches = allocate_kv_caches(cfg, -(-max_model_len // block_size), block_size, kv_dtype or dtype)
        from hitenter.models.plan import apply_plan, build_plan

        apply_plan(model, build_plan(model, kv_caches, dtype, batch_invariant))   # the engine's row paths
    except BaseException:
        ctrl.put(("error", rank, traceback.format_exc()))
        return
    ctrl.put(("ready", rank))
    with serving(ctrl, rank):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=WORKER_TIMEOUT)
        while True:
            header = torch.empty(2, dtype=torch.long)
            dist.recv(header, 0, tag=HEADER_TAG)
            job, n = (int(x) for x in header.tolist())
            if job < 0:
                break
            ids = torch.empty(n, dtype=torch.long)
            dist.recv(ids, 0, tag=IDS_TAG)
            t0 = time.perf_counter()
            kv = prefill_kv(model, ids, kv_caches, block_size, chunk)
            t1 = time.perf_counter()
            dist.send(kv, 0, tag=kv_tag(job))
            t2 = time.perf_counter()
            dist.send(torch.tensor([t1 - t0, t2 - t1], dtype=torch.float64), 0, tag=timing_tag(job))


def main() -> None:
    run_worker(prefill_worker_main)


if __name__ == "__main__":
    main()
