"""Start this node's worker ranks. Node 0's engine core calls spawn_workers for local ranks
1..K-1; every other node runs `python -m mlxr.distributed.launch --nnodes N --node-rank R
--nproc-per-node K --master-addr A --master-port P --device cuda`, which starts ranks R*K..R*K+K-1
with torchrun's environment and waits: if one of them exits, it stops the others and exits."""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

from mlxr.config import ParallelConfig

log = logging.getLogger("mlxr.distributed.launch")


def spawn_workers(parallel: ParallelConfig, device_type: str, master_port: int) -> list[subprocess.Popen]:
    """This node's worker processes (rank 0, on node 0, is the caller: not started here)."""
    from mlxr.distributed.parallel_state import Rendezvous  # torch: not for the CLI's start-up

    k = parallel.nproc_per_node
    procs = []
    for local in range(k):
        rank = parallel.node_rank * k + local
        if rank == 0:
            continue
        rdzv = Rendezvous(rank, parallel.tensor_parallel_size, local, k, parallel.master_addr, master_port)
        env = {**os.environ, **rdzv.env(), "MLXR_TP_DEVICE": device_type, "MLXR_TP_PARENT_PID": str(os.getpid()),
               "MLXR_TP_TIMEOUT_S": str(parallel.timeout_s)}
        procs.append(subprocess.Popen([sys.executable, "-m", "mlxr.distributed.worker"], env=env))
    return procs


def stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Wait a little for each process to exit, then kill it: none is left behind."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_node(parallel: ParallelConfig, device_type: str) -> int:
    procs = spawn_workers(parallel, device_type, parallel.master_port)
    try:
        while True:
            done = [p for p in procs if p.poll() is not None]
            if done:
                failed = [p for p in done if p.returncode != 0]
                if failed or len(done) == len(procs):
                    break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        stop(procs)
    codes = [p.returncode for p in procs]
    if any(codes):
        log.error("node %d: worker exit statuses %s", parallel.node_rank, codes)
    return 1 if any(codes) else 0


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split the model over this many devices (one process each)")
    p.add_argument("--nnodes", type=int, default=1, help="hosts the tensor-parallel group spans")
    p.add_argument("--node-rank", type=int, default=0, help="this host's rank (0: the one that serves)")
    p.add_argument("--master-addr", default="127.0.0.1", help="node 0's address, reachable from every node")
    p.add_argument("--master-port", type=int, default=0, help="a free port on node 0 (0: pick one; one node only)")


def parallel_from(ns: argparse.Namespace) -> ParallelConfig:
    return ParallelConfig(ns.tensor_parallel_size, ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="python -m mlxr.distributed.launch", description=__doc__)
    add_parallel_options(p)
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU a rank)")
    ns = p.parse_args(argv)
    parallel = parallel_from(ns)
    if parallel.node_rank == 0:
        p.error("node 0 is the one that serves: run `mlxr serve` or `mlxr generate` there")
    return run_node(parallel, ns.device)


if __name__ == "__main__":
    sys.exit(main())
