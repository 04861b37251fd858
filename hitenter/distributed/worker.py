"""A tensor-parallel worker process (ranks 1..N-1): loads its shard, then mirrors rank 0's forwards.

Life cycle (started by `DistributedModelRunner` as `python -m hitenter.distributed.worker`, its
arguments pickled on stdin: a fresh interpreter like a spawn start, but one that does not re-import the
user's `__main__`, so scripts need no `if __name__ == "__main__"` guard):
  1. load this rank's shard of the model (while rank 0 loads its own), then report ("ready", rank)
     or ("error", rank, traceback) on the control pipe, so load failures reach the user as text;
  2. join the gloo process group (init_process_group on 127.0.0.1:port), receive ("init", num_blocks,
     block_size, batch_invariant) (rank 0 sizes the KV cache once the model is loaded) and allocate its
     KV cache shard;
  3. loop on rank 0's broadcasts: ("forward", ids, positions, AttentionMetadata) runs the sharded
     forward (same collectives as rank 0), ("logits", hidden) the vocab-parallel LM head + gather,
     ("stop",) leaves the loop.
A worker never outlives rank 0: a collective with a dead peer fails (the socket closes), and a
watchdog thread exits the process when its parent is gone.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
from torch import distributed as dist

# Workers wait for the next step for as long as the engine is idle; rank 0's death is caught by the
# closed socket or the parent watchdog, not by this timeout.
WORKER_TIMEOUT = timedelta(days=7)


class ControlPipe:
    """Length-prefixed pickled messages over a pipe file descriptor (worker -> rank 0)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def put(self, item: Any) -> None:
        data = memoryview(struct.pack("<I", len(item := pickle.dumps(item))) + item)
        while data:
            data = data[os.write(self.fd, data):]


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(3)


@contextmanager
def serving(ctrl: ControlPipe, rank: int) -> Iterator[None]:
    """A worker's serving phase: any failure is reported on the control pipe and ends the process at once
    (os._exit: nothing may wait on a collective whose peers are gone); the process group is always left."""
    try:
        yield
    except BaseException:
        try:
            ctrl.put(("error", rank, traceback.format_exc()))
        except Exception:
            pass
        os._exit(2)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_worker(entry: Callable[..., None]) -> None:
    """A worker module's entry point: its arguments come pickled on stdin, the control pipe's fd among them."""
    args = pickle.load(sys.stdin.buffer)
    ctrl = ControlPipe(args.pop("ctrl_fd"))
    entry(ctrl=ctrl, parent_pid=os.getppid(), **args)


def worker_main(rank: int, size: int, port: int, path: str, num_threads: int, load_options: dict[str, Any],
                ctrl: Any, parent_pid: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(num_threads)
    try:
        from hitenter.distributed.group import TPGroup, broadcast_object
        from hitenter.models.attention import allocate_kv_caches
        from hitenter.models.loader import load_model

        group = TPGroup(rank, size)
        model, cfg = load_model(path, tp=group, **load_options)
    except BaseException:
        ctrl.put(("error", rank, traceback.format_exc()))
        return
    ctrl.put(("ready", rank))
    with serving(ctrl, rank):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=WORKER_TIMEOUT)
        _, num_blocks, block_size, model.batch_invariant, kv_name = broadcast_object(None)   # ("init", ...)
        kv_caches = allocate_kv_caches(cfg, num_blocks, block_size, getattr(torch, kv_name),
                                       num_kv_heads=model.layers[0].num_kv_heads)
        with torch.inference_mode():
            while True:
                msg = broadcast_object(None)
                if msg[0] == "forward":
                    model(msg[1], msg[2], msg[3], kv_caches)
                elif msg[0] == "logits":
                    model.compute_logits(msg[1])
                elif msg[0] == "stop":
                    break
                else:
                    raise RuntimeError(f"unknown command {msg[0]!r}")


def main() -> None:
    run_worker(worker_main)


if __name__ == "__main__":
    main()
