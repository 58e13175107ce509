"""Frozen configuration records built at the edge (CLI, LLM(...)) and passed down."""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from mlxr.errors import InvalidParameterError


def _env_flag(name: str, default: bool | None) -> bool | None:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


# The KV cache's storage formats (ops/attention/kv_quant.py, docs/kv-cache.md): "auto" is the
# model's dtype; fp8, q8_0 and q4_0 are packed in blocks of 32 values with a scale each.
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "fp16", "fp8", "q8_0", "q4_0")
# Ollama's OLLAMA_KV_CACHE_TYPE values, as these names.
OLLAMA_KV_CACHE_TYPES = {"f16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0"}


def kv_cache_dtype_from_env() -> str:
    """OLLAMA_KV_CACHE_TYPE (f16, q8_0, q4_0) as a KV cache dtype, "auto" when unset."""
    value = os.environ.get("OLLAMA_KV_CACHE_TYPE", "").strip().lower()
    if not value:
        return "auto"
    if value not in OLLAMA_KV_CACHE_TYPES:
        raise InvalidParameterError("OLLAMA_KV_CACHE_TYPE", f"{value!r} is not one of f16, q8_0, q4_0")
    return OLLAMA_KV_CACHE_TYPES[value]


MAX_SPECULATIVE_TOKENS = 16
HEAD_METHODS = ("eagle3", "mtp")  # proposers that draft from the target's hidden states
SPECULATIVE_METHODS = ("suffix", "ngram", "draft", *HEAD_METHODS)


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: one process per device, torch.distributed between them. The
    rendezvous names are torchrun's (MASTER_ADDR, MASTER_PORT, node rank); master_port 0 on
    one node picks a free port."""

    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    timeout_s: float = 600.0  # the rendezvous's and every collective's limit
    # Capture decode/prefill CUDA graphs on every rank, all-reduces inside (NCCL). Off until it
    # has run on GPUs: tensor-parallel steps run eagerly by default.
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        tp, nodes = self.tensor_parallel_size, self.nnodes
        if tp < 1 or nodes < 1 or tp % nodes or not 0 <= self.node_rank < nodes:
            raise ValueError(f"tensor_parallel_size {tp} must be a positive multiple of nnodes {nodes}, "
                             f"and node_rank {self.node_rank} in 0..{nodes - 1}")
        if nodes > 1 and self.master_port == 0:
            raise ValueError("several nodes need an agreed --master-port")

    @property
    def nproc_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes


def _env_int(name: str, default: int, low: int, high: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise InvalidParameterError(name, f"must be an integer from {low} to {high}, got {value!r}")
    return number


@dataclass(frozen=True)
class SuffixConfig:
    """Suffix decoding's bounds (engine/spec_decode/suffix.py; the environment sets the defaults).
    max_depth: tokens of a tree path (a match is at most max_depth - 1); window: a prompt's latest
    tokens a request's tree indexes, and a cached output's; max_request_nodes: a request's tree
    past it is rebuilt from its latest tokens; cache_responses / cache_nodes: the shared tree of
    finished outputs (0 responses: none); alpha: drafts per matched token at most; min_prob: the
    continuation's empirical probability under which the draft stops."""

    max_depth: int = field(default_factory=lambda: _env_int("MLXR_SUFFIX_MAX_DEPTH", 24, 2, 64))
    window: int = field(default_factory=lambda: _env_int("MLXR_SUFFIX_WINDOW", 4096, 16, 1 << 20))
    max_request_nodes: int = field(default_factory=lambda: _env_int("MLXR_SUFFIX_MAX_NODES", 1 << 17, 1024, 1 << 24))
    cache_responses: int = field(default_factory=lambda: _env_int("MLXR_SUFFIX_CACHE_RESPONSES", 256, 0, 1 << 16))
    cache_nodes: int = field(default_factory=lambda: _env_int("MLXR_SUFFIX_CACHE_NODES", 1 << 19, 1024, 1 << 24))
    alpha: float = 1.0
    min_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.max_request_nodes < 2 * self.max_depth or self.cache_nodes < self.max_depth:
            raise InvalidParameterError("suffix", "node bounds must exceed twice the tree depth")
        if not (self.alpha > 0 and 0 <= self.min_prob <= 1):
            raise InvalidParameterError("suffix", "alpha must be > 0 and min_prob in 0..1")


MAX_DATA_PARALLEL = 64
MAX_STEP_TIME_TARGET_S = 60.0


MAX_LORAS = 256  # resident adapter slots: each holds every projection's A and B
MAX_LORA_RANK = 512


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the serving engine (vLLM names)."""

    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    # How the KV cache stores K and V (KV_CACHE_DTYPES); unset: OLLAMA_KV_CACHE_TYPE, else "auto".
    kv_cache_dtype: str = field(default_factory=kv_cache_dtype_from_env)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # A step's target time: its tokens follow the device's measured speed (at most
    # max_num_batched_tokens), so a request arriving waits about this long for the step running
    # and as long again for its own; prefill rows share a step fairly (engine/sched/budget.py).
    # 0: every step may take max_num_batched_tokens.
    step_time_target_s: float = 0.5
    max_model_len: int | None = None  # None: the model's context length
    enable_prefix_caching: bool = True
    # Hybrid models: recurrent-state checkpoints kept for prefix caching (docs/kv-cache.md);
    # None: sized from kv_cache_memory_gb.
    num_state_checkpoints: int | None = None
    swap_space_gb: float = 0.0  # preempted sequences swap here (a pool apart from the tiers below)
    # KV cache tiers (engine/kv/tiers.py): prefix blocks the device evicts are kept in this much host
    # memory; with a directory, every computed block is also written there (up to kv_cache_disk_gb,
    # least recently used out) and found again after a restart.
    kv_host_cache_gb: float = 0.0
    kv_cache_dir: str | None = None
    kv_cache_disk_gb: float = 10.0
    # At start, the disk's most recently used blocks fill up to this fraction of the device cache's
    # blocks, as cached prefixes (evicted like any other), so the first requests after a restart
    # find them on the device. 0: restore only when a request asks.
    kv_cache_preload: float = 0.5
    max_waiting: int = 1024
    enable_cuda_graphs: bool = True  # decode steps replay captured graphs on CUDA
    enable_cpu_graphs: bool = True  # small decode steps replay recorded native calls on the CPU (engine/worker/cpu_graphs.py)
    # Graph block tables span the whole context; the Triton decode kernel skips the empty
    # part, the torch reference does not (set 32 with MLXR_KERNELS=reference).
    cuda_graph_max_batch: int = 256
    # Prefill chunks of one sequence replay graphs captured at 64..2048 tokens (Triton kernels only).
    enable_prefill_graphs: bool = True
    # Launch step N+1 before taking in step N's tokens, so host work overlaps the GPU.
    # None: on CUDA only (on the CPU nothing runs asynchronously); True also on the CPU (tests).
    overlap_steps: bool | None = None
    # The engine core in a process of its own (ZMQ + msgspec), keeping detokenizing and HTTP off
    # the step loop; False: the core runs in a thread of this process; None: a process on CUDA,
    # a thread on the CPU (where the two would share the same cores). MLXR_ENGINE_PROCESS=1|0.
    engine_process: bool | None = field(default_factory=lambda: _env_flag("MLXR_ENGINE_PROCESS", None))
    # Run the shapes serving will meet before taking requests, so kernels compile and graphs
    # capture at start-up, not in a user's request.
    warm_up: bool = True
    warm_up_budget_s: float = 120.0
    # tensor_parallel_size > 1: the core process is rank 0 of a group (mlxr/distributed/)
    parallel: ParallelConfig = ParallelConfig()

    # Speculative decoding (docs/speculative-decoding.md): "suffix" (suffix trees over the request
    # and recent outputs), "ngram" (prompt lookup), "draft" (speculative_draft_model drafts),
    # "eagle3" or "mtp" (a model head: speculative_model);
    # num_speculative_tokens drafts at most per row and step;
    # above speculative_max_batch running requests nothing is drafted.
    speculative_method: str | None = None
    num_speculative_tokens: int = 4
    speculative_draft_model: str | None = None
    # "eagle3": an EAGLE-3 head's directory; "mtp": the checkpoint directory holding the target's
    # mtp.* tensors (the target's own, for a model that ships its MTP layer with it).
    speculative_model: str | None = None
    speculative_max_batch: int = 8
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    # The step costs measured on this device kind (engine/spec_decode/batch_policy.py): with an
    # entry for the device, drafts per row and step come from them and each request's acceptance
    # at any batch, and speculative_max_batch bounds jump-forward alone. None: the bundled table
    # (MLXR_SPEC_COST_TABLE names another, `none`: the fixed cut-off everywhere).
    speculative_cost_table: str | None = field(default_factory=lambda: os.environ.get("MLXR_SPEC_COST_TABLE"))
    # Jump-forward: a structured-output row drafts the tokens its grammar forces next (a schema's
    # keys and punctuation), verified like any draft, while at most speculative_max_batch
    # requests run, with or without a speculative_method. MLXR_JUMP_FORWARD=0: off.
    jump_forward: bool = field(default_factory=lambda: _env_flag("MLXR_JUMP_FORWARD", True))
    # KV-cache events in vLLM's wire format (engine/kv/events.py, docs/serving.md): a ZMQ PUB socket
    # bound at this address ("tcp://127.0.0.1:5557", "ipc://..."), an optional replay socket
    # (ROUTER); a non-loopback address needs kv_events_allow_remote (the events carry token ids).
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_allow_remote: bool = False
    # Engine cores behind one frontend, each with its own KV cache (engine/frontend/dp_client.py);
    # data_parallel_rank: which one this core is (its event batches carry it; ports are offset by it).
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    # LoRA adapters (docs/lora.md): enable_lora wraps the projections at start; up to max_loras
    # adapters are resident at once (idle ones evicted least recently used); an adapter's rank
    # may be at most max_lora_rank (vLLM's default, 64); lora_modules: (name, path) loaded at start.
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 64
    lora_modules: tuple[tuple[str, str], ...] = ()
    lora_max_bytes: int = 4 << 30  # an adapter file's size at most
    lora_max_tensors: int = 4096  # an adapter file's tensors at most

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidParameterError("kv_cache_dtype", f"{self.kv_cache_dtype!r} is not one of "
                                        f"{', '.join(KV_CACHE_DTYPES)}")
        if not 1 <= self.max_loras <= MAX_LORAS:
            raise InvalidParameterError("max_loras", f"must be 1 to {MAX_LORAS}")
        if not 1 <= self.max_lora_rank <= MAX_LORA_RANK:
            raise InvalidParameterError("max_lora_rank", f"must be 1 to {MAX_LORA_RANK}")
        if not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL:
            raise InvalidParameterError("data_parallel_size", f"must be 1 to {MAX_DATA_PARALLEL}")
        for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):
            if (endpoint := getattr(self, name)) is not None:
                check_event_endpoint(name, endpoint, self.kv_events_allow_remote)
        if self.kv_events_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise InvalidParameterError("kv_events_replay_endpoint", "needs kv_events_endpoint")
        if self.speculative_method not in (None, *SPECULATIVE_METHODS):
            raise InvalidParameterError("speculative_method", f"must be one of {', '.join(SPECULATIVE_METHODS)}")
        if (self.speculative_method in HEAD_METHODS) != (self.speculative_model is not None):
            raise InvalidParameterError("speculative_model", "is needed by, and only by, speculative_method "
                                                             "'eagle3' or 'mtp'")
        if not 0.0 <= self.step_time_target_s <= MAX_STEP_TIME_TARGET_S:
            raise InvalidParameterError("step_time_target_s", f"must be 0 to {MAX_STEP_TIME_TARGET_S:g} seconds")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidParameterError("num_speculative_tokens", f"must be 1 to {MAX_SPECULATIVE_TOKENS}")
        if (self.speculative_method == "draft") != (self.speculative_draft_model is not None):
            raise InvalidParameterError("speculative_draft_model", "is needed by, and only by, speculative_method 'draft'")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:  # "*", an interface name, a DNS name: not provably loopback
        return False


def check_event_endpoint(name: str, endpoint: str, allow_remote: bool) -> None:
    """A ZMQ address the KV events may be bound at: tcp://HOST:PORT or ipc://PATH; HOST must be a
    loopback one unless allow_remote (a wildcard or a public address shares every prompt's tokens)."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme == "ipc" and sep and rest:
        return
    host, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not sep or not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidParameterError(name, f"{endpoint!r} is not tcp://HOST:PORT or ipc://PATH")
    if not allow_remote and not _is_loopback(host):
        raise InvalidParameterError(name, f"{endpoint!r} is not a loopback address; KV events carry "
                                          "prompt token ids, so binding elsewhere needs --kv-events-allow-remote")


def offset_port(endpoint: str, rank: int) -> str:
    """Replica `rank`'s address: a tcp port plus rank, an ipc path with a _dp<rank> suffix (vLLM's rule)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + rank}"


def default_num_threads(usable_cpus: int) -> int:
    """CPU threads when neither --threads nor MLXR_NUM_THREADS says: every CPU this process may
    use. What keeps this from collapsing on a shared machine is the wait policy below."""
    return max(1, usable_cpus)


def openmp_environment(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to set before torch (and its OpenMP runtime) loads. Threads that finish a
    parallel region early sleep instead of spinning: on a machine where another process holds a
    core, a spinning thread burns the time slice its descheduled partner needs, and decode
    fell 5x (bench/threads.py). A value the user set wins."""
    return {} if "OMP_WAIT_POLICY" in env else {"OMP_WAIT_POLICY": "PASSIVE"}


MAX_STREAM_INTERVAL = 1024  # --stream-interval's bound
MAX_API_SERVERS = 16  # --api-servers' bound


@dataclass(frozen=True)
class ServerConfig:
    """`mlxr serve` settings; built by cli/serve.py from argv and the environment."""

    host: str = "127.0.0.1"
    port: int = 11434
    api_keys: tuple[str, ...] = ()
    allow_unauthenticated: bool = False
    cors_origins: tuple[str, ...] = ()  # besides localhost, 127.0.0.1 and [::1] on any port ("*": all)
    allowed_hosts: tuple[str, ...] = ()  # Host names besides the loopback ones ("*": any); see server/access.py
    max_body_bytes: int = 8 << 20
    max_blob_bytes: int = 256 << 30  # one /api/blobs upload (a model file); free disk space also bounds it
    keep_alive_s: float = 300.0  # Ollama's default 5m; negative = forever
    max_loaded_models: int = 2
    preload: tuple[str, ...] = ()  # models to load at start-up
    home: str = "~/.mlxr"  # MLXR_HOME: the registry and logs live here
    device: str | None = None
    dtype: str | None = None
    quantization: str | None = None  # see loader.load_model
    engine: EngineConfig = EngineConfig()
    stream_interval: int = 1  # tokens a streamed response gathers per write (vLLM's --stream-interval)
    allow_remote_images: bool = False  # fetch http(s) image URLs (off: data: URLs only)
    # API processes in front of each engine core (vLLM's --api-server-count); above 1 the models
    # given at start are pinned (server/supervisor.py). MLXR_API_SERVERS.
    api_servers: int = 1
