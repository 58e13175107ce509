"""The process group of one tensor-parallel model and its collectives. The group object is
handed to the sharded layers that use it; nothing here is a module-level global."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class WorkerGroupError(RuntimeError):
    """A rank of the tensor-parallel group is gone: the group cannot run another step."""


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's names for where a rank stands and where the group meets."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def env(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Rendezvous:
        world = int(env["WORLD_SIZE"])
        return cls(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
                   int(env.get("LOCAL_WORLD_SIZE", world)), env["MASTER_ADDR"], int(env["MASTER_PORT"]))


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def cpu_threads(local_world_size: int) -> int:
    """A CPU rank's share of the CPUs this process may run on (a data-parallel replica's are
    its share of the host's, which its workers inherit)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // local_world_size)


def rank_device(device_type: str, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")


class TPGroup:
    """One model's ranks: `group` carries the activations (NCCL or gloo), `cpu_group` (gloo)
    the step messages, so a message never waits on the device (vLLM's cpu_group)."""

    def __init__(self, rdzv: Rendezvous, device: torch.device, timeout_s: float) -> None:
        self.rank, self.world, self.device = rdzv.rank, rdzv.world_size, device
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, init_method=f"tcp://{rdzv.master_addr}:{rdzv.master_port}",
                                rank=rdzv.rank, world_size=rdzv.world_size, timeout=timeout)
        self.group = dist.group.WORLD
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else self.group
        log.info("rank %d of %d joined (%s on %s)", self.rank, self.world, backend, device)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (gloo sums 16-bit floats in float32: same numbers, older gloo builds)."""
        if t.is_cpu and t.dtype != torch.float32:
            wide = t.float()
            dist.all_reduce(wide, group=self.group)
            return wide.to(t.dtype)
        dist.all_reduce(t, group=self.group)
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's t side by side along the last dim, in rank order."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's bytes to every rank (data is None off rank 0)."""
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, 0, group=self.cpu_group)
        buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None
               else torch.empty(int(size), dtype=torch.uint8))
        if len(buf):
            dist.broadcast(buf, 0, group=self.cpu_group)
        return data if data is not None else buf.numpy().tobytes()

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def die_with_parent(parent_pid: int) -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, so no worker
    outlives its engine core even when the core was killed with -9."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        log.warning("no prctl here: a worker may outlive a killed engine core")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
