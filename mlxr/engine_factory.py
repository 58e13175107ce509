"""The one place an engine is built from a model reference: the offline API and the server both
come here. With EngineConfig.engine_process the engine core runs in its own process and loads
the weights there; this process keeps the tokenizer."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import torch

from mlxr.config import EngineConfig, ParallelConfig
from mlxr.engine.core.core_parts import CoreParts
from mlxr.engine.core.core_attach import Attachment
from mlxr.engine.core.gc_tuning import tune_gc_once
from mlxr.engine.frontend.attached_client import AttachedClient
from mlxr.engine.frontend.core_client import MPClient
from mlxr.engine.frontend.dp_client import DPClient
from mlxr.errors import InvalidParameterError
from mlxr.engine.frontend.llm_engine import LLMEngine
from mlxr.loader import LoadedModel, load_frontend, load_model
from mlxr.loader.lora import adapter_reader
from mlxr.loader.mtp_weights import read_mtp_tensors

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelSpec:
    """How to load a model: what LLM() and the server's model manager were given."""

    ref: str
    dtype: torch.dtype | None = None
    device: torch.device | str | None = None
    weight_dtype: torch.dtype | None = None
    quantization: str | None = None
    projector: str | None = None  # llama.cpp's mmproj GGUF beside a GGUF model

    def load(self, progress: Callable[[int, int], None] | None = None) -> LoadedModel:
        return load_model(self.ref, dtype=self.dtype, device=self.device, weight_dtype=self.weight_dtype,
                          quantization=self.quantization, progress=progress, projector=self.projector)

    def as_strings(self) -> dict[str, str | None]:
        name = {v: k for k, v in DTYPES.items()}
        return {"ref": self.ref, "dtype": name.get(self.dtype), "weight_dtype": name.get(self.weight_dtype),
                "device": None if self.device is None else str(self.device), "quantization": self.quantization}


def core_parts(ref: str, dtype: str | None, weight_dtype: str | None, device: str | None,
               quantization: str | None, draft: str | None = None, projector: str | None = None) -> CoreParts:
    """The engine core process's factory (core_proc.py): the weights (and a speculative
    draft model's), loaded there."""
    spec = ModelSpec(ref, DTYPES.get(dtype), device, DTYPES.get(weight_dtype), quantization, projector)
    loaded = spec.load()
    return CoreParts(loaded.model, loaded.args, loaded.dtype, loaded.device, tokenizer=loaded.tokenizer,
                     model_digest=model_digest(loaded), draft=_draft_parts(spec, draft),
                     read_adapter=adapter_reader(loaded.args), read_mtp=read_mtp_tensors)


SAMPLE_BYTES = 1 << 20


def model_digest(loaded: LoadedModel) -> str:
    """The disk tier's key for a model's KV: its files (names, sizes, and their first, middle and
    last MiB: hashing many GB at every start would cost more than the prefill it saves) and how
    they were loaded (weight storage and quantization change the KV's values)."""
    h = hashlib.sha256(f"{loaded.weight_dtype} {loaded.quantization} {loaded.args.model_type}".encode())
    path = Path(loaded.source.path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if f.suffix not in (".gguf", ".safetensors", ".json"):
            continue
        size = f.stat().st_size
        h.update(f"{f.name} {size}".encode())
        with open(f, "rb") as fh:
            for offset in sorted({0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}):
                fh.seek(offset)
                h.update(fh.read(SAMPLE_BYTES))
    return "sampled-sha256:" + h.hexdigest()


def _draft_parts(spec: ModelSpec, draft: str | None) -> CoreParts | None:
    """The draft model, loaded as the target is (same dtype, device and quantization)."""
    if draft is None:
        return None
    loaded = ModelSpec(draft, spec.dtype, spec.device, spec.weight_dtype, spec.quantization).load()
    return CoreParts(loaded.model, loaded.args, loaded.dtype, loaded.device)


@dataclass(frozen=True)
class Built:
    engine: LLMEngine
    loaded: LoadedModel | None  # None when the weights live in the core's process
    args: object  # ModelArgs
    tokenizer: object


def core_launch(spec: ModelSpec, config: EngineConfig) -> tuple[str, dict[str, str | None]]:
    """The factory ("module:function") and its arguments that a core process loads spec with."""
    if config.parallel.tensor_parallel_size > 1:  # (speculative decoding is not offered under tensor parallelism)
        if spec.projector is not None:
            raise InvalidParameterError("tensor_parallel_size", "is not offered yet for a GGUF model with an mmproj file")
        kwargs = spec.as_strings()
        kwargs["parallel"] = msgspec.json.encode(config.parallel).decode()
        return "mlxr.distributed.executor:tp_core_parts", kwargs
    return "mlxr.engine_factory:core_parts", {**spec.as_strings(), "draft": config.speculative_draft_model,
                                              "projector": spec.projector}


@dataclass(frozen=True)
class ReplicaLaunch:
    """How a data-parallel replica's core process starts: its factory, its ranked config, and
    the CPUs or CUDA devices it (and its tensor-parallel workers) may use."""
    factory: str
    kwargs: dict[str, str | None]
    config: EngineConfig
    cpus: list[int] | None
    cuda_devices: list[str] | None


def replica_launches(spec: ModelSpec, config: EngineConfig, events: str) -> list[ReplicaLaunch]:
    """N core processes, each on its own CUDA device or its share of this process's CPUs (with
    tensor parallelism: its own tensor_parallel_size devices, or its share of the CPUs split
    between its ranks), publishing KV events at `events` offset by its rank."""
    n, tp = config.data_parallel_size, config.parallel.tensor_parallel_size
    if config.parallel.nnodes > 1:
        raise InvalidParameterError("data_parallel_size", "is not offered with a tensor-parallel group over several "
                                                          "nodes: run a server per group behind a router")
    cuda = spec.device is not None and torch.device(spec.device).type == "cuda"
    if cuda and torch.cuda.device_count() < n * tp:
        raise InvalidParameterError("data_parallel_size", f"{n} replicas need {n * tp} CUDA devices ({tp} each), "
                                                          f"{torch.cuda.device_count()} are visible")
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // n)
    out = []
    for rank in range(n):
        ranked = replace(config, data_parallel_rank=rank, kv_events_endpoint=events, engine_process=True,
                         parallel=_replica_group(config.parallel, rank))
        own = None if cuda or len(cpus) < n else cpus[rank * share:(rank + 1) * share]
        device, visible = spec.device, None
        if cuda and tp > 1:  # the replica's ranks see its devices alone, as cuda:0..tp-1
            device, visible = "cuda:0", _visible_devices()[rank * tp:(rank + 1) * tp]
        elif cuda:
            device = f"cuda:{rank}"
        out.append(ReplicaLaunch(*core_launch(replace(spec, device=device), ranked), ranked, own, visible))
    return out


def data_parallel_client(spec: ModelSpec, config: EngineConfig) -> DPClient:
    """The replicas' core processes, started and restarted by this process; their KV events go
    where the user said (each replica at its port offset) or to private sockets."""
    private = None if config.kv_events_endpoint else tempfile.mkdtemp(prefix="mlxr-dp-")
    events = config.kv_events_endpoint or f"ipc://{private}/kv-events"
    try:
        launches = replica_launches(spec, config, events)
    except BaseException:
        if private:
            shutil.rmtree(private, ignore_errors=True)
        raise

    def launch(rank: int) -> MPClient:
        r = launches[rank]
        return MPClient(r.factory, r.kwargs, r.config, cpus=r.cpus, cuda_devices=r.cuda_devices)

    cleanup = (lambda: shutil.rmtree(private, ignore_errors=True)) if private else (lambda: None)
    return DPClient(launch, config.data_parallel_size, config.block_size, events, on_shutdown=cleanup)


def _replica_group(parallel: ParallelConfig, rank: int) -> ParallelConfig:
    """A replica's own tensor-parallel rendezvous: a free port each, or the given one offset by rank."""
    if parallel.tensor_parallel_size == 1 or parallel.master_port == 0:
        return parallel
    return replace(parallel, master_port=parallel.master_port + rank)


def _visible_devices() -> list[str]:
    """The CUDA devices this process sees, as CUDA_VISIBLE_DEVICES names them."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    return given.split(",") if given else [str(i) for i in range(torch.cuda.device_count())]


def attach_engine(spec: ModelSpec, config: EngineConfig, attachment: Attachment) -> Built:
    """An engine over the core processes that a supervisor started (`mlxr serve --api-servers
    N`): this process keeps the tokenizer and attaches to each core through its own channel;
    several (data-parallel replicas) behind this process's own placement, the supervisor
    restarting a replica that dies."""
    channels = attachment.channels
    if len(channels) == 1:
        return _frontend_engine(spec, config, lambda: AttachedClient(*channels[0]))
    return _frontend_engine(spec, config, lambda: DPClient(lambda rank: AttachedClient(*channels[rank]),
                                                           len(channels), config.block_size, attachment.events))


def _frontend_engine(spec: ModelSpec, config: EngineConfig, connect: Callable[[], object]) -> Built:
    """The tokenizer first: a model that cannot load leaves no core process behind."""
    _, args, tokenizer = load_frontend(spec.ref, spec.projector)
    parts = CoreParts(None, args, None, None, tokenizer=tokenizer)  # the core loads the weights
    built = Built(LLMEngine(parts, config, core=connect()), None, args, tokenizer)
    tune_gc_once()  # this process builds the outputs of every step: the core's collector settings
    return built


def build_engine(spec: ModelSpec, config: EngineConfig,
                 progress: Callable[[int, int], None] | None = None) -> Built:
    """progress(done, total) as the weights' tensors are placed (in this process only)."""
    if config.data_parallel_size > 1:
        return _frontend_engine(spec, config, lambda: data_parallel_client(spec, config))
    tensor_parallel = config.parallel.tensor_parallel_size > 1
    own_process = True if tensor_parallel else config.engine_process  # the core process is rank 0
    if own_process is None:
        own_process = spec.device is not None and torch.device(spec.device).type == "cuda"
    if own_process:
        return _frontend_engine(spec, config, lambda: MPClient(*core_launch(spec, config), config))
    loaded = spec.load(progress)
    parts = CoreParts(loaded.model, loaded.args, loaded.dtype, loaded.device, tokenizer=loaded.tokenizer,
                      model_digest=model_digest(loaded) if config.kv_cache_dir else "",
                      draft=_draft_parts(spec, config.speculative_draft_model), read_adapter=adapter_reader(loaded.args),
                      read_mtp=read_mtp_tensors)
    return Built(LLMEngine(parts, config), loaded, loaded.args, loaded.tokenizer)


def is_encoder_model(ref: str) -> bool:
    """Whether ref names an encoder (an embedding or reranking model), from its config alone."""
    from mlxr.loader.encoder_model import source_is_encoder
    from mlxr.loader.resolve import resolve_model

    return source_is_encoder(resolve_model(ref))


def build_encoder_engine(spec: ModelSpec, config: EngineConfig) -> Built:
    """An encoder's engine: whole inputs per forward in this process, batches of up to
    config.max_num_batched_tokens padded tokens (docs/embeddings.md)."""
    from mlxr.engine.encoder.encoder_engine import EncoderEngine
    from mlxr.loader.encoder_model import load_encoder

    loaded = load_encoder(spec.ref, dtype=spec.dtype, device=spec.device)
    engine = EncoderEngine(loaded.model, loaded.args, loaded.device, loaded.pooling, loaded.normalize,
                           config.max_num_batched_tokens)
    return Built(engine, None, loaded.args, loaded.tokenizer)
