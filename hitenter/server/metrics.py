"""Prometheus metrics of one server app, each app with its own CollectorRegistry (vLLM's names, hitenter: prefix).

Token counters are fed by the generation path as outputs stream out (generation.count_output, so
aborted requests still count the work they did); latency histograms and the success counter when a
request finishes; gauges are read from each engine
client's published snapshot when ``/metrics`` is scraped (never waiting on a step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from hitenter.server.engine_client import EngineClient

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, model_names: list[str]) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.ttft = Histogram("hitenter:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("hitenter:inter_token_latency_seconds", "Time between output tokens.", labels,
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("hitenter:e2e_request_latency_seconds", "Arrival to finish.", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("hitenter:request_queue_time_seconds", "Arrival to first scheduled.", labels,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.running = Gauge("hitenter:num_requests_running", "Sequences running.", labels, registry=r)
        self.waiting = Gauge("hitenter:num_requests_waiting", "Sequences waiting.", labels, registry=r)
        self.kv_usage = Gauge("hitenter:kv_cache_usage_perc", "KV cache usage, 0..1.", labels, registry=r)
        # prometheus_client appends _total to counters itself
        self.prompt_tokens = Counter("hitenter:prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("hitenter:generation_tokens", "Tokens generated.", labels, registry=r)
        self.cached_tokens = Counter("hitenter:cached_prompt_tokens", "Prompt tokens served from the prefix cache.",
                                     labels, registry=r)
        self.preemptions = Counter("hitenter:num_preemptions", "Preemptions of finished requests.", labels,
                                   registry=r)
        self.success = Counter("hitenter:request_success", "Requests finished.", labels + ["finished_reason"],
                               registry=r)
        self.aborted = Counter("hitenter:aborted_requests", "Requests aborted (client gone or error).", labels,
                               registry=r)
        # engine-wide totals read at scrape time (gauges: they are set from the engine's own counters)
        self.prefix_hit_rate = Gauge("hitenter:prefix_cache_hit_rate", "Prompt tokens served from the prefix cache "
                                     "/ prompt tokens looked up, 0..1.", labels, registry=r)
        self.spec_draft = Gauge("hitenter:spec_decode_num_draft_tokens", "Tokens drafted by the speculative "
                                "proposer so far.", labels, registry=r)
        self.spec_accepted = Gauge("hitenter:spec_decode_num_accepted_tokens", "Drafted tokens the target "
                                   "accepted so far.", labels, registry=r)
        self.spec_rate = Gauge("hitenter:spec_decode_acceptance_rate", "Accepted / drafted tokens, 0..1.", labels,
                               registry=r)
        self.spec_len = Gauge("hitenter:spec_decode_mean_accepted_length", "Accepted drafts per verification "
                              "pass.", labels, registry=r)
        self.encoder_runs = Gauge("hitenter:vision_encoder_runs", "Images the vision encoder encoded so far.",
                                  labels, registry=r)
        self.encoder_hits = Gauge("hitenter:vision_encoder_cache_hits", "Images served from the encoder cache "
                                  "without encoding so far.", labels, registry=r)
        for name in model_names:     # every series exists (at 0) from the start
            for metric in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.preemptions,
                           self.aborted, self.running, self.waiting, self.kv_usage):
                metric.labels(name)
            for reason in ("stop", "length"):
                self.success.labels(name, reason)

    def render(self, clients: dict[str, EngineClient]) -> bytes:
        """Set the gauges from each client's latest snapshot and render the text format."""
        for m, client in clients.items():
            snap = client.snapshot()
            self.prefix_hit_rate.labels(m).set(float(snap.scheduler.prefix_cache_hit_rate))
            spec = client.spec_stats()
            if spec is not None:
                self.spec_draft.labels(m).set(spec.num_draft_tokens)
                self.spec_accepted.labels(m).set(spec.num_accepted_tokens)
                self.spec_rate.labels(m).set(spec.acceptance_rate)
                self.spec_len.labels(m).set(spec.mean_accepted_length)
            vision = getattr(client, "vision_stats", lambda: None)()
            if vision is not None:
                self.encoder_runs.labels(m).set(vision[0])
                self.encoder_hits.labels(m).set(vision[1])
            self.running.labels(m).set(snap.num_running)
            self.waiting.labels(m).set(snap.num_waiting)
            self.kv_usage.labels(m).set(float(snap.kv_usage))
        return generate_latest(self.registry)
