"""Tensor parallelism over torch.distributed (NCCL on CUDA, gloo on CPU): rank 0 is the engine
core process, which schedules and samples; every other rank is a worker that runs the same
forward on its shard of the weights and KV cache (see executor.py and worker.py)."""
