"""Disaggregated prefill/decode (Splitwise; DistServe, OSDI 2024) on torch.distributed point-to-point.

`disaggregate="prefill=1,decode=1"`: this process (rank 0) is the decode side and runs the whole
engine; one prefill worker process (rank 1, disagg_worker.py) holds its own copy of the model and a
scratch KV cache. A new request's prompt minus its last token goes to the worker (isend over gloo);
the worker computes those tokens' KV blocks and sends them back as one tensor, which rank 0 receives
into a staging buffer (irecv posted at submit, so the worker never waits on rank 0). Meanwhile the
request waits in the scheduler as WAITING_FOR_REMOTE_KV. When the KV has arrived (`poll`, called by
`LLMEngine.step`) it joins the waiting queue with `num_computed_tokens = len(prompt) - 1` to come, like
a prefix hit; at admission the scheduler allocates its blocks and `DisaggModelRunner.execute` copies
the staged KV into them before the forward that computes the last prompt token and samples the first
output token. Batch invariance makes the tokens and logprobs bitwise those of the single engine.

Why blocks are allocated at admission, not at submit: the decode side's cache is not held by prompts
still being prefilled remotely, and the ordinary scheduler rules (FCFS, preemption) stay as they are;
the cost is a staging buffer and one copy (a request's blocks are scattered, so a direct receive into
the cache would need one message per block and layer anyway). A preempted request recomputes locally.

gloo point-to-point `Work.is_completed()` never turns true without `wait()`, so a waiter thread waits on
each job's transfers in order and flags them; the engine thread only reads the flags. Failure: a dead
worker, a failed transfer or a job at the head of the queue for longer than HITENTER_DISAGG_TIMEOUT_S
(default 300 s) raises DisaggregationError from `poll` (and from `check`, so from every later
add_request/step); the requests waiting for remote KV are aborted first (they hold no blocks).
`close()` (also a weakref finalizer) sends the stop header, joins, terminates stragglers, leaves the group.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch import distributed as dist

from hitenter import envs
from hitenter.config import ModelConfig
from hitenter.distributed.disagg_worker import HEADER_TAG, IDS_TAG, kv_tag, timing_tag
from hitenter.distributed.runner import _free_port, _wait_ready, _Workers
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.scheduler import Scheduler, SchedulerOutput
from hitenter.models.prompt_kv import load_staged
from hitenter.request import Request, RequestStatus


class DisaggregationError(RuntimeError):
    """The prefill worker failed, died or timed out; requests waiting for its KV were aborted."""


def parse_disaggregate(spec: str) -> int:
    """'prefill=1,decode=1' -> number of prefill workers (1). ValueError naming the option otherwise."""
    parts: dict[str, int] = {}
    try:
        for item in spec.split(","):
            k, v = item.split("=")
            parts[k.strip()] = int(v)
    except ValueError:
        raise ValueError(f"disaggregate: expected 'prefill=1,decode=1', got {spec!r}") from None
    if set(parts) != {"prefill", "decode"} or parts != {"prefill": 1, "decode": 1}:
        raise ValueError(f"disaggregate: only 'prefill=1,decode=1' is supported (one prefill worker; "
                         f"this process decodes), got {spec!r}")
    return parts["prefill"]


class _PrefillWorkers(_Workers):
    def send_stop(self) -> None:
        self.stop_work = dist.isend(torch.tensor([-1, 0], dtype=torch.long), 1, tag=HEADER_TAG)


@dataclass
class _Job:
    job_id: int
    requests: list[Request]           # the n sequences of one prompt share the job
    num_tokens: int                   # prompt tokens prefilled remotely (len(prompt) - 1)
    kv: torch.Tensor                  # staging buffer the KV is received into
    timing: torch.Tensor
    works: list[Any] = field(default_factory=list)
    keep: list[torch.Tensor] = field(default_factory=list)   # send buffers must outlive their isend
    t_submit: float = field(default_factory=time.monotonic)
    t_head: float | None = None       # when the waiter thread started on it (the worker's turn)
    t_done: float | None = None
    done: bool = False
    error: str | None = None


def _wait_jobs(jobs: queue.Queue[_Job | None], arrived: threading.Event) -> None:
    """The waiter thread (no reference to the client, so the client can be garbage collected)."""
    while (job := jobs.get()) is not None:
        job.t_head = time.monotonic()
        try:
            for w in job.works:
                w.wait()
            job.t_done = time.monotonic()
            job.done = True
        except Exception as e:    # peer gone (connection closed) or the group destroyed
            job.error = f"{type(e).__name__}: {e}"
        arrived.set()
        if job.error is not None:
            return


class PrefillClient:
    """Rank 0's side of the prefill worker: submit prompts, poll for their KV, hand it to the runner."""

    def __init__(self, workers: _PrefillWorkers, kv_shape: tuple[int, int, int, int], dtype: torch.dtype,
                 timeout_s: float) -> None:
        self.workers = workers
        self.kv_shape = kv_shape          # (layers, block_size, kv_heads, head_dim)
        self.dtype = dtype
        self.timeout_s = timeout_s
        self.error: DisaggregationError | None = None
        self.jobs: list[_Job] = []        # in flight, submit order
        self.staged: dict[str, tuple[torch.Tensor, int]] = {}   # arrived, not admitted yet
        self._next_job = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._arrived = threading.Event()
        self._thread = threading.Thread(target=_wait_jobs, args=(self._queue, self._arrived),
                                        name="hitenter-disagg-recv", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _close, workers, self._queue, self._thread)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.workers.procs]

    def check(self) -> None:
        """Raise the failure, if any (also when the worker died while idle)."""
        if self.error is None and (dead := self.workers.dead()):
            self._fail(f"prefill worker died: {', '.join(dead)}")
        if self.error is not None:
            raise self.error

    def submit(self, requests: list[Request]) -> None:
        """Send the prompt minus its last token to the worker for `requests` (sequences of one prompt)."""
        self.check()
        prompt_ids = requests[0].prompt_token_ids
        n = len(prompt_ids) - 1
        layers, bs, kvh, hd = self.kv_shape
        job = _Job(self._next_job, list(requests), n,
                   torch.empty((layers, 2, kvh, -(-n // bs), bs, hd), dtype=self.dtype),
                   torch.zeros(2, dtype=torch.float64))
        self._next_job += 1
        header = torch.tensor([job.job_id, n], dtype=torch.long)
        ids = torch.tensor(prompt_ids[:-1], dtype=torch.long)
        try:
            job.works = [dist.irecv(job.kv, 1, tag=kv_tag(job.job_id)),
                         dist.irecv(job.timing, 1, tag=timing_tag(job.job_id)),
                         dist.isend(header, 1, tag=HEADER_TAG), dist.isend(ids, 1, tag=IDS_TAG)]
        except Exception as e:
            self._fail(f"sending a prompt to the prefill worker failed ({type(e).__name__}: {e})")
        job.keep = [header, ids]
        self.jobs.append(job)
        self._queue.put(job)

    def takes(self, request: Request, scheduler: Scheduler) -> bool:
        """Every prompt of more than one token is prefilled by the worker."""
        return request.num_prompt_tokens > 1

    def poll(self, scheduler: Scheduler) -> None:
        """Make requests whose KV arrived schedulable; wait briefly when nothing else can run."""
        self._arrived.clear()
        if self.jobs and not self.jobs[0].done and not scheduler.waiting and not scheduler.running:
            self._arrived.wait(0.02)      # idle engine: don't spin while the worker computes
        while self.jobs and self.jobs[0].done:
            job = self.jobs.pop(0)
            for req in job.requests:
                rid = req.request_id
                if scheduler.get_request(rid) is not req or req.status is not RequestStatus.WAITING_FOR_REMOTE_KV:
                    continue              # aborted meanwhile (its id may have been reused since)
                prefill_s, send_s = job.timing.tolist()
                assert job.t_done is not None and job.t_head is not None
                req.extra["disaggregated"] = {
                    "prefill_tokens": job.num_tokens, "kv_bytes": job.kv.numel() * job.kv.element_size(),
                    "prefill_queue_s": job.t_head - job.t_submit, "prefill_s": prefill_s, "transfer_s": send_s,
                    "remote_total_s": job.t_done - job.t_submit}
                self.staged[rid] = (job.kv, job.num_tokens)
                scheduler.remote_kv_ready(rid, job.num_tokens)
        try:
            self.check()
            head = self.jobs[0] if self.jobs else None
            if head is not None and head.error is not None:
                self._fail(f"receiving KV from the prefill worker failed ({head.error})")
            if head is not None and head.t_head is not None and time.monotonic() - head.t_head > self.timeout_s:
                self._fail(f"prefill worker did not answer within {self.timeout_s:g} s (HITENTER_DISAGG_TIMEOUT_S)")
        except DisaggregationError:
            self._abort_waiting(scheduler)     # they hold no blocks; the caller sees the error
            raise

    def discard(self, request_id: str) -> None:
        """Forget an aborted request's staged KV (a job still in flight is dropped on arrival)."""
        self.staged.pop(request_id, None)

    def load(self, out: SchedulerOutput, kv_caches: list[torch.Tensor]) -> None:
        """Copy the staged KV of the requests admitted in this step into their first blocks."""
        load_staged(self.staged, out.scheduled, kv_caches)

    def _abort_waiting(self, scheduler: Scheduler) -> None:
        for job in self.jobs:
            for req in job.requests:
                if scheduler.get_request(req.request_id) is req:
                    scheduler.finish_request(req.request_id, RequestStatus.FINISHED_ABORTED)
        self.jobs.clear()

    def _fail(self, msg: str) -> None:
        if self.error is None:
            time.sleep(0.05)
            dead = self.workers.dead()
            if dead and "died" not in msg:
                msg += f"; prefill worker died: {', '.join(dead)}"
            detail = self.workers.errors()
            self.error = DisaggregationError(msg + (f"\nprefill worker errors:\n{detail}" if detail else ""))
            self.workers.healthy = False
            self.close()
        raise self.error

    def close(self) -> None:
        """Stop the prefill worker and leave the process group (idempotent)."""
        self._finalizer()


def _close(workers: _PrefillWorkers, jobs: queue.Queue[_Job | None], thread: threading.Thread) -> None:
    jobs.put(None)
    workers.close()      # stop header (when healthy), join / terminate, destroy the group
    thread.join(timeout=2)


class DisaggModelRunner(ModelRunner):
    """The decode side's runner: loads arrived prompt KV into newly admitted requests' blocks first
    (ModelRunner's ``staged`` hook)."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 client: PrefillClient) -> None:
        super().__init__(model, kv_caches, block_size, staged=client)
        self.disagg = client


def check_options(spec: str, model: str | None, options: dict[str, Any]) -> None:
    """ValueError naming the option for what disaggregated prefill does not combine with (nothing started)."""
    parse_disaggregate(spec)
    if int(options.get("tensor_parallel_size") or 1) > 1:
        raise ValueError("disaggregate: cannot be combined with tensor_parallel_size > 1")
    if options.get("speculative_model") or options.get("speculative_method"):
        raise ValueError("disaggregate: cannot be combined with speculative decoding")
    if (options.get("quantization") or "none") not in ("none", "gguf"):   # the worker loads dense or gguf only
        raise ValueError("disaggregate: cannot be combined with int8 / int4 quantization yet")
    if model is not None and model.startswith("trigram"):
        raise ValueError("disaggregate: needs a GGUF model (the prefill worker loads it), not the trigram toy")


def launch_runner(spec: str, path: str, dtype: torch.dtype, cfg: ModelConfig, model: torch.nn.Module,
                  kv_caches: list[torch.Tensor], block_size: int, max_model_len: int, chunk: int,
                  num_threads: int | None = None) -> DisaggModelRunner:
    """Start the prefill worker (it loads the model at `path`), join the group as rank 0, return the runner."""
    parse_disaggregate(spec)
    if dist.is_initialized():
        raise DisaggregationError("a torch.distributed process group already exists in this process; "
                                  "close the other distributed engine first")
    threads = num_threads or max(1, (os.cpu_count() or 1) // 2)
    workers = _PrefillWorkers(torch.get_num_threads(), _free_port())
    try:
        workers.start(1, dict(port=workers.port, path=str(path), dtype=dtype, num_threads=threads,
                              block_size=block_size, max_model_len=max_model_len, chunk=chunk,
                              batch_invariant=bool(getattr(model, "batch_invariant", True)),
                              weight_format=str(getattr(model, "weight_format", "dense")),
                              kv_dtype=kv_caches[0].dtype if kv_caches else dtype),
                      module="hitenter.distributed.disagg_worker")
        torch.set_num_threads(threads)
        _wait_ready(workers, 1, "prefill worker", DisaggregationError)
        # the group waits as long as the engine idles; liveness and the job timeout guard against hangs
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{workers.port}", rank=0, world_size=2,
                                timeout=timedelta(days=7))
    except BaseException:
        workers.healthy = False
        workers.close()
        raise
    timeout = envs.HITENTER_DISAGG_TIMEOUT_S.get()
    row = kv_caches[0].shape[-1] if kv_caches else cfg.head_dim   # a head row's elements (q8_0: its bytes)
    client = PrefillClient(workers, (cfg.num_layers, block_size, cfg.num_kv_heads, row),
                           kv_caches[0].dtype if kv_caches else dtype, timeout)
    return DisaggModelRunner(model, kv_caches, block_size, client)
