"""`DistributedModelRunner`: ModelRunner's interface over a tensor-parallel group of processes.

This process is rank 0: it runs the scheduler, the sampler and the whole engine, and its own shard
of the model. `launch()` spawns ranks 1..N-1 (hitenter/distributed/worker.py), waits until each has
loaded its shard (a load error or a dead worker raises here, with the worker's traceback), then joins
the gloo group on 127.0.0.1 with a free port. Each step, the wrapped model broadcasts the batch
(input ids, positions, AttentionMetadata, pickled) before its own forward, and the hidden rows to
score before the LM head, so every rank runs the same collectives in the same order; the logits
arrive gathered on rank 0. ModelRunner.execute itself is reused unchanged.

Failure and shutdown: before each step the workers' liveness is checked; a dead worker, or any
collective error or timeout (HITENTER_TP_TIMEOUT_S, default 120 s), raises TensorParallelError and
tears the group down (never a hang). `close()` (also run by a weakref finalizer, so at garbage
collection and at interpreter exit) sends ("stop",), joins the workers, terminates stragglers and
destroys the process group: no orphan processes.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist

from hitenter import envs
from hitenter.config import ModelConfig
from hitenter.distributed.group import TensorParallelError, TPGroup, broadcast_object, validate_tp
from hitenter.engine.model_runner import ModelRunner, ModelRunnerOutput
from hitenter.engine.scheduler import SchedulerOutput
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.decoder import CausalLM

LOAD_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Workers:
    """The worker processes, their control pipe and the process group; `close()` is idempotent, never raises."""

    def __init__(self, prev_threads: int, port: int) -> None:
        self.port = port
        self.procs: list[subprocess.Popen[bytes]] = []
        self.rfd, self.wfd = os.pipe()
        self.buf = b""
        self.prev_threads = prev_threads
        self.healthy = True
        self.closed = False

    def start(self, rank: int, args: dict[str, Any], module: str = "hitenter.distributed.worker") -> None:
        root = str(Path(__file__).resolve().parents[2])      # hitenter importable even when not installed
        env = envs.child_env(pythonpath_first=root)
        p = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                             pass_fds=(self.wfd,), env=env)
        self.procs.append(p)
        assert p.stdin is not None
        p.stdin.write(pickle.dumps({**args, "rank": rank, "ctrl_fd": self.wfd}))
        p.stdin.close()

    def get(self, timeout: float) -> Any | None:
        """The next control message, or None when none arrives within `timeout` seconds."""
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack("<I", self.buf[:4])[0]:
            if not select.select([self.rfd], [], [], timeout)[0]:
                return None
            self.buf += os.read(self.rfd, 1 << 16)
        n = struct.unpack("<I", self.buf[:4])[0]
        item, self.buf = pickle.loads(self.buf[4:4 + n]), self.buf[4 + n:]
        return item

    def errors(self) -> str:
        msgs = []
        while (item := self.get(0.0)) is not None:
            if item[0] == "error":
                msgs.append(f"rank {item[1]}:\n{item[2]}")
        return "\n".join(msgs)

    def dead(self) -> list[str]:
        return [f"rank {i + 1} (pid {p.pid}, exit code {p.returncode})" for i, p in enumerate(self.procs)
                if p.poll() is not None]

    def send_stop(self) -> None:
        """Tell healthy workers to leave their loop (disaggregated prefill workers get another message)."""
        broadcast_object(("stop",))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        stopped = False
        if self.healthy and dist.is_initialized() and not self.dead():
            try:
                self.send_stop()
                stopped = True
            except Exception:
                pass
        # told to stop, a worker gets 5 s to leave on its own; one never told (unhealthy: hung or stopped) would
        # only use them up, so it is terminated at once (SIGCONT lets a SIGSTOPped one take the SIGTERM)
        deadline = time.monotonic() + (5 if stopped else 0)
        for p in self.procs:
            for stop in (None, p.terminate, p.kill):
                if stop is not None:
                    stop()
                    if p.poll() is None:
                        try:
                            os.kill(p.pid, signal.SIGCONT)
                        except ProcessLookupError:
                            pass
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()) if stop is None else 2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        torch.set_num_threads(self.prev_threads)


class _Rank0Model:
    """Rank 0's shard, wrapped so each call first tells the workers to make the same call."""

    def __init__(self, inner: CausalLM, group: TPGroup) -> None:
        self.inner = inner
        self.group = group
        self.broadcast_seconds = 0.0

    def __getattr__(self, name: str) -> Any:       # config, batch_invariant, layers, ...
        return getattr(self.__dict__["inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "batch_invariant":
            setattr(self.inner, name, value)       # workers keep the value they were launched with
        else:
            object.__setattr__(self, name, value)

    def _send(self, msg: tuple[Any, ...]) -> None:
        t0 = time.perf_counter()
        broadcast_object(msg)
        self.broadcast_seconds += time.perf_counter() - t0

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                 kv_caches: list[torch.Tensor]) -> torch.Tensor:
        self._send(("forward", input_ids, positions, attn))
        return self.inner(input_ids, positions, attn, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._send(("logits", hidden))
        return self.inner.compute_logits(hidden)


class DistributedModelRunner(ModelRunner):
    """ModelRunner over `tp_size` processes (this one is rank 0). Build it with `launch()`."""

    def __init__(self, model: _Rank0Model, kv_caches: list[torch.Tensor], block_size: int, workers: _Workers,
                 tp_size: int) -> None:
        super().__init__(model, kv_caches, block_size)   # type: ignore[arg-type]
        self.workers = workers
        self.tp_size = tp_size
        self.error: TensorParallelError | None = None
        self._finalizer = weakref.finalize(self, workers.close)

    @classmethod
    def launch(cls, model: CausalLM, dtype: torch.dtype, num_blocks: int, block_size: int,
               batch_invariant: bool = True, timeout_s: float | None = None,
               kv_dtype: torch.dtype | None = None) -> DistributedModelRunner:
        """Join the group with the workers `load_rank0` started, size their KV caches (of `kv_dtype`,
        default `dtype`), return the runner."""
        workers = getattr(model, "_tp_workers", None)
        if not isinstance(workers, _Workers) or workers.closed:
            raise ValueError("launch() needs rank 0's shard, built by load_rank0()")
        group: TPGroup = model.tp   # type: ignore[assignment]
        try:
            model.batch_invariant = batch_invariant
            kv_dtype = kv_dtype or dtype
            kv = allocate_kv_caches(model.config, num_blocks, block_size, kv_dtype,
                                    num_kv_heads=model.layers[0].num_kv_heads)
            _wait_ready(workers, group.size - 1)
            timeout = timeout_s or envs.HITENTER_TP_TIMEOUT_S.get()
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{workers.port}", rank=0,
                                    world_size=group.size, timeout=timedelta(seconds=timeout))
            broadcast_object(("init", num_blocks, block_size, batch_invariant, str(kv_dtype).removeprefix("torch.")))
        except BaseException:
            workers.healthy = False
            workers.close()
            raise
        return cls(_Rank0Model(model, group), kv, block_size, workers, group.size)

    @property
    def comm_seconds(self) -> float:
        """Rank 0's time in collectives so far: batch broadcasts + all-reduces + logits gathers."""
        m = self.model
        return m.broadcast_seconds + m.group.comm_seconds   # type: ignore[attr-defined]

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if self.error is not None:
            raise self.error
        if not out.scheduled:
            return ModelRunnerOutput(None, [], 0.0)
        dead = self.workers.dead()
        if dead:
            raise self._fail(f"tensor-parallel worker died: {', '.join(dead)}")
        try:
            return super().execute(out)
        except TensorParallelError:
            raise
        except Exception as e:    # a gloo error (peer closed, timeout) or a failed forward: ranks out of step
            raise self._fail(f"tensor-parallel step failed ({type(e).__name__}: {e}); "
                             f"dead workers: {', '.join(self.workers.dead()) or 'none'}") from e

    def _fail(self, msg: str) -> TensorParallelError:
        time.sleep(0.05)
        detail = self.workers.errors()
        self.error = TensorParallelError(msg + (f"\nworker errors:\n{detail}" if detail else ""))
        self.workers.healthy = False
        self.close()
        return self.error

    def close(self) -> None:
        """Stop the workers and leave the process group (idempotent)."""
        self._finalizer()


def load_rank0(path: str, dtype: str | torch.dtype, tp_size: int, num_threads: int | None = None,
               quantization: str | None = None, batch_invariant: bool = True,
               max_model_len: int | None = None, reader: Any = None) -> tuple[CausalLM, ModelConfig]:
    """Check that `tp_size` ranks can shard the GGUF at `path` (ValueError, nothing started), start the
    workers loading their shards, and load rank 0's meanwhile; every rank loads with load_model's options
    (`dtype` "auto": the file's blocks). `reader`: the file already open (its header parsed), else opened
    here. `DistributedModelRunner.launch` finishes; the workers are stopped if the model is dropped before that."""
    from hitenter.models.gguf import model_config_from_metadata, open_gguf, read_gguf_metadata
    from hitenter.models.loader import load_model

    reader = reader if reader is not None else open_gguf(path)
    validate_tp(model_config_from_metadata(read_gguf_metadata(reader), {t.name for t in reader.tensors}), tp_size)
    if dist.is_initialized():
        raise TensorParallelError("a torch.distributed process group already exists in this process; "
                                  "close the other tensor-parallel engine first")
    threads = num_threads or max(1, (os.cpu_count() or 1) // tp_size)
    workers = _Workers(torch.get_num_threads(), _free_port())
    try:
        opts = dict(dtype=dtype, quantization=quantization, batch_invariant=batch_invariant,
                    max_model_len=max_model_len)
        for r in range(1, tp_size):
            workers.start(r, dict(size=tp_size, port=workers.port, path=str(path), num_threads=threads,
                                  load_options=opts))
        torch.set_num_threads(threads)
        model, cfg = load_model(path, tp=TPGroup(0, tp_size), reader=reader, **opts)   # type: ignore[arg-type]
    except BaseException:
        workers.healthy = False
        workers.close()
        raise
    model.eval()
    model._tp_workers = workers
    weakref.finalize(model, workers.close)
    return model, cfg


def _wait_ready(workers: _Workers, n: int, what: str = "tensor-parallel worker",
                error: type[RuntimeError] = TensorParallelError) -> None:
    ready: set[int] = set()
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while len(ready) < n:
        item = workers.get(timeout=0.2)
        if item is None:
            dead = workers.dead()
            if dead:
                raise error(f"{what} died while loading: {', '.join(dead)}") from None
            if time.monotonic() > deadline:
                raise error(f"{what}s not ready after {LOAD_TIMEOUT_S:.0f} s") from None
            continue
        if item[0] == "error":
            raise error(f"{what} rank {item[1]} failed to load:\n{item[2]}")
        ready.add(item[1])
