"""Prometheus metrics under vLLM's names (label model_name), one registry per app.

Gauges and counters are read from each engine's EngineStats at scrape time; histograms are
observed per request by the routes (see trace.py)."""
from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mlxr.config import EngineConfig
from mlxr.types import EngineStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
SPEC_DECODE_COUNTERS = (
    ("spec_decode_num_drafts", "Decode rows that carried draft tokens", lambda s: s.spec_num_drafts),
    ("spec_decode_num_draft_tokens", "Draft tokens proposed", lambda s: s.spec_num_draft_tokens),
    ("spec_decode_num_accepted_tokens", "Draft tokens accepted", lambda s: s.spec_num_accepted_tokens),
)
# Jump-forward's share of the counters above (a grammar's forced tokens, drafted and verified).
JUMP_FORWARD_COUNTERS = (
    ("jump_forward_num_drafts", "Of vllm:spec_decode_num_drafts, rows that drafted their grammar's forced tokens",
     lambda s: s.jump_forward_drafts),
    ("jump_forward_num_draft_tokens", "Of vllm:spec_decode_num_draft_tokens, a grammar's forced tokens",
     lambda s: s.jump_forward_draft_tokens),
    ("jump_forward_num_accepted_tokens", "Of vllm:spec_decode_num_accepted_tokens, a grammar's forced tokens",
     lambda s: s.jump_forward_accepted_tokens),
)


def one_two_five_buckets(limit: int) -> tuple[float, ...]:
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


class EngineCollector(Collector):
    """Reads the stats of every loaded engine when Prometheus scrapes."""

    def __init__(self, snapshot, engine: EngineConfig = EngineConfig(), dtype: str | None = None) -> None:
        # snapshot() -> {model_name: EngineStats}; called on the scrape thread.
        self._snapshot = snapshot
        self._engine, self._dtype = engine, dtype

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        yield from _gauges(stats)
        yield from _counters(stats)
        yield from _tiers(stats)
        yield from _info(stats, self._engine, self._dtype)
        yield from _replicas(stats)


REPLICA_METRICS = (  # (name, kind, help, key of EngineStats.data_parallel[replica])
    ("mlxr:dp_replica_up", "gauge", "1 while the data-parallel replica's engine core runs", "up"),
    ("mlxr:dp_replica_restarts", "counter", "Times the replica's engine core died and was started again "
     "(within the last minute)", "restarts"),
    ("mlxr:dp_replica_requests_running", "gauge", "Requests in the replica's running batch", "running"),
    ("mlxr:dp_replica_requests_waiting", "gauge", "Requests waiting in the replica", "waiting"),
    ("mlxr:dp_replica_load_tokens", "gauge", "Prompt and sampled tokens of the requests the replica holds",
     "load_tokens"),
    ("mlxr:dp_replica_kv_blocks_used", "gauge", "The replica's KV blocks held by requests", "kv_blocks_used"),
    ("mlxr:dp_replica_kv_blocks_total", "gauge", "The replica's KV blocks", "kv_blocks_total"),
    ("mlxr:dp_replica_prefix_cache_hits", "counter", "Prompt tokens the replica found in its prefix cache",
     "prefix_hit_tokens"),
    ("mlxr:dp_replica_prefix_cache_queries", "counter", "Prompt tokens the replica looked up in its prefix cache",
     "prefix_queried_tokens"),
    ("mlxr:dp_replica_blocks_indexed", "gauge", "Blocks the router knows the replica holds (from its KV events)",
     "blocks_indexed"),
)


def _replicas(stats: dict[str, EngineStats]) -> Iterator[Metric]:
    """--data-parallel-size N: each replica's figures (label replica), and the router's placements by reason."""
    for name, kind, doc, key in REPLICA_METRICS:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name, doc, labels=["model_name", "replica"])
        for model, s in stats.items():
            for replica, figures in sorted(s.data_parallel.items()):
                family.add_metric([model, replica], float(figures[key]))
        yield family
    placed = CounterMetricFamily("mlxr:dp_placements", "Requests placed on a replica, by reason (prefix: it held "
                                 "the longest cached prefix; load: none held one, least loaded; balance: the "
                                 "prefix holder was too loaded)", labels=["model_name", "replica", "reason"])
    for model, s in stats.items():
        for replica, figures in sorted(s.data_parallel.items()):
            for key, count in sorted(figures.items()):
                if key.startswith("placed_"):
                    placed.add_metric([model, replica, key.removeprefix("placed_")], float(count))
    yield placed


CACHE_INFO_LABELS = ("model_name", "engine", "block_size", "cache_dtype", "enable_prefix_caching",
                     "prefix_caching_hash_algo", "num_gpu_blocks", "num_cpu_blocks", "swap_space")


def _info(stats: dict[str, EngineStats], engine: EngineConfig, dtype: str | None) -> Iterator[Metric]:
    """vLLM's info gauges: the cache's configuration as labels (value 1), and the LoRA adapters
    running and waiting, comma-separated (the value is the scrape's time, as vLLM's)."""
    cache = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine's cache_config",
                              labels=list(CACHE_INFO_LABELS))
    lora = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                             labels=["model_name", "max_lora", "waiting_lora_adapters", "running_lora_adapters"])
    for model, s in stats.items():
        host_blocks = str(s.kv_tiers.get("host", {}).get("capacity_blocks", 0))
        # one sample per engine core (label engine, as vLLM's): a data-parallel replica each
        engines = {r: f["kv_blocks_total"] for r, f in sorted(s.data_parallel.items())} or {"0": s.kv_blocks_total}
        for engine_index, blocks in engines.items():
            # "auto": the KV cache holds the model's activation dtype (vLLM's word for the same default)
            cache.add_metric([model, engine_index, str(engine.block_size), dtype or "auto",
                              str(engine.enable_prefix_caching), "sha256", str(blocks), host_blocks,
                              str(engine.swap_space_gb)], 1.0)
        lora.add_metric([model, str(s.max_lora), ",".join(s.waiting_lora_adapters), ",".join(s.running_lora_adapters)],
                        time.time())
    yield cache
    yield lora


def _gauges(stats: dict[str, EngineStats]) -> Iterator[Metric]:
    specs = [
        ("vllm:num_requests_running", "Requests in the running batch", lambda s: s.num_requests_running),
        ("vllm:num_requests_waiting", "Requests waiting to be scheduled", lambda s: s.num_requests_waiting),
        ("vllm:num_requests_swapped", "Requests swapped out to host memory", lambda s: s.num_requests_swapped),
        ("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1)", lambda s: s.kv_cache_usage),
        ("mlxr:kv_blocks_total", "KV cache blocks", lambda s: s.kv_blocks_total),
        ("mlxr:kv_blocks_used", "KV cache blocks held by requests", lambda s: s.kv_blocks_used),
        ("mlxr:kv_blocks_cached", "Free KV blocks still holding a reusable prefix", lambda s: s.kv_blocks_cached),
    ]
    for name, doc, value in specs:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        for model, s in stats.items():
            g.add_metric([model], float(value(s)))
        yield g


def _counters(stats: dict[str, EngineStats]) -> Iterator[Metric]:
    specs = [
        ("vllm:prompt_tokens", "Prefill tokens admitted", lambda s: s.prompt_tokens_total),
        ("vllm:generation_tokens", "Tokens generated", lambda s: s.generation_tokens_total),
        ("vllm:num_preemptions", "Preemptions of running sequences", lambda s: s.num_preemptions),
        ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
         lambda s: s.prefix_cache_queried_tokens),
        ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", lambda s: s.prefix_cache_hit_tokens),
        ("mlxr:num_requests_aborted", "Requests aborted (client gone or cancelled)", lambda s: s.num_aborted),
        ("mlxr:runtime_compiles", "Kernels compiled after the engine's warm-up (each paused a step)",
         lambda s: s.runtime_compiles),
        ("mlxr:vision_encoder_calls", "Images run through a vision tower (a prefix-cache hit runs none)",
         lambda s: s.vision_encoder_calls),
    ]
    specs += [(f"vllm:{n}", doc, value) for n, doc, value in SPEC_DECODE_COUNTERS]
    specs += [(f"mlxr:{n}", doc, value) for n, doc, value in JUMP_FORWARD_COUNTERS]
    for name, doc, value in specs:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        for model, s in stats.items():
            c.add_metric([model], float(value(s)))
        yield c
    ok = CounterMetricFamily("vllm:request_success", "Finished requests by reason",
                             labels=["model_name", "finished_reason"])
    for model, s in stats.items():
        for reason, count in sorted(s.finished_by_reason.items()):
            ok.add_metric([model, reason], float(count))
    yield ok
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted at each draft position (0-based)",
                                  labels=["model_name", "position"])
    for model, s in stats.items():
        for position, count in enumerate(s.spec_accepted_per_position):
            per_pos.add_metric([model, str(position)], float(count))
    yield per_pos


TIER_METRICS = (  # (name, kind, help, key of EngineStats.kv_tiers[tier])
    ("mlxr:kv_tier_hits", "counter", "KV blocks found in a lower tier instead of recomputed", "hits"),
    ("mlxr:kv_tier_read_bytes", "counter", "Bytes of KV copied back to the device from a tier", "bytes_read"),
    ("mlxr:kv_tier_written_bytes", "counter", "Bytes of KV copied into a tier", "bytes_written"),
    ("mlxr:kv_tier_blocks", "gauge", "KV blocks resident in a tier", "blocks"),
    ("mlxr:kv_tier_skipped_files", "counter", "Disk tier files skipped (corrupt, truncated, mismatched)",
     "skipped_files"),
    ("mlxr:kv_tier_write_errors", "counter", "Disk tier writer errors (a full disk turns writes off)",
     "write_errors"),
    ("mlxr:kv_tier_writes_enabled", "gauge", "1 while the disk tier still writes", "writes_enabled"),
    ("mlxr:kv_tier_preloaded_blocks", "gauge", "Disk tier blocks loaded into the device cache at start",
     "preloaded_blocks"),
)


def _tiers(stats: dict[str, EngineStats]) -> Iterator[Metric]:
    for name, kind, doc, key in TIER_METRICS:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name, doc, labels=["model_name", "tier"])
        for model, s in stats.items():
            for tier, figures in sorted(s.kv_tiers.items()):
                if key in figures:
                    family.add_metric([model, tier], float(figures[key]))
        yield family
    rejected = CounterMetricFamily("mlxr:kv_disk_rejected", "Disk tier entries skipped when read, by reason "
                                   "(missing, symlink, not_regular, unreadable, truncated, corrupt, foreign, forged)",
                                   labels=["model_name", "reason"])
    for model, s in stats.items():
        for key, count in sorted(s.kv_tiers.get("disk", {}).items()):
            if key.startswith("rejected_"):
                rejected.add_metric([model, key.removeprefix("rejected_")], float(count))
    yield rejected


class ServerMetrics:
    """The app's registry: the engine collector plus per-request histograms."""

    def __init__(self, snapshot, max_tokens_bucket: int = 1 << 17, api_server: tuple[int, int] = (0, 1),
                 engine: EngineConfig = EngineConfig(), dtype: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(snapshot, engine, dtype))
        # Under --api-servers N a scrape reaches one API process: this says which, since its
        # request counters and histograms are its own (the engine gauges are the shared core's).
        Gauge("mlxr:api_server_info", "The API process that answered this scrape (index of count)",
              ["index", "count"], registry=self.registry).labels(*map(str, api_server)).set(1)
        tokens = one_two_five_buckets(max_tokens_bucket)
        h = lambda name, doc, buckets: Histogram(  # noqa: E731
            name, doc, ["model_name"], registry=self.registry, buckets=buckets)
        self.ttft = h("vllm:time_to_first_token_seconds", "From HTTP arrival to the first token", TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Between successive token outputs", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "From HTTP arrival to the last token", LATENCY_BUCKETS)
        self.queue = h("vllm:request_queue_time_seconds", "From admission to first scheduling", LATENCY_BUCKETS)
        self.prompt_tokens = h("vllm:request_prompt_tokens", "Prompt tokens per request", tokens)
        self.generation_tokens = h("vllm:request_generation_tokens", "Generated tokens per request", tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
