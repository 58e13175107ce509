"""The delta rule's CPU kernels (ops/delta_rule/delta_rule.c) beside their torch references, one
layer's worth at Qwen3.5-like shapes: the chunked scan and the causal convolution over a prompt,
and the one-step decode update at a few batch sizes. Best of --repeats, with the CPU and the
1-minute load average recorded (a shared host moves both: read the ratios).

  python bench/delta_rule_kernels.py                       # 2048 tokens, 16 value / 8 key heads of 128
  python bench/delta_rule_kernels.py --tokens 512 --value-heads 32 --key-heads 16
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from common import cpu_model, print_table, write_result


def best_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--value-heads", type=int, default=16)
    p.add_argument("--key-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from mlxr.ops.delta_rule import delta_rule_cpu
    from mlxr.ops.delta_rule.delta_rule import causal_conv, delta_rule_chunked, delta_rule_step

    torch.set_num_threads(a.threads)
    t, hk, hv, d = a.tokens, a.key_heads, a.value_heads, a.head_dim
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(t, hk, d, generator=gen), torch.randn(t, hk, d, generator=gen)
    v = torch.randn(t, hv, d, generator=gen)
    g, beta = -F.softplus(torch.randn(t, hv, generator=gen)), torch.rand(t, hv, generator=gen)
    state = torch.zeros(hv, d, d)
    qv, kv = q.repeat_interleave(hv // hk, 1), k.repeat_interleave(hv // hk, 1)
    channels = 2 * hk * d + hv * d
    x, w, conv_state = torch.randn(t, channels, generator=gen), torch.randn(channels, 4, generator=gen), torch.zeros(channels, 3)
    rows = []

    def row(op: str, kernel, reference) -> None:
        c_s, ref_s = best_s(kernel, a.repeats), best_s(reference, a.repeats)
        rows.append({"op": op, "load": round(os.getloadavg()[0], 2), "c_ms": c_s * 1e3, "reference_ms": ref_s * 1e3,
                     "speedup": ref_s / c_s})

    row(f"chunked scan, {t} tokens", lambda: delta_rule_cpu.delta_chunked_cpu(q, k, v, g, beta, state.clone()),
        lambda: delta_rule_chunked(qv, kv, v, g, beta, state))
    row(f"causal conv, {t} tokens x {channels}", lambda: delta_rule_cpu.causal_conv_cpu(x, conv_state.clone(), w),
        lambda: causal_conv(x, conv_state, w))
    for b in (1, 4):
        pool, slots = torch.zeros(b, hv, d, d), torch.arange(b)
        row(f"decode step, batch {b}", lambda: delta_rule_cpu.delta_step_cpu(q[:b], k[:b], v[:b], g[:b], beta[:b], pool, slots),
            lambda: delta_rule_step(qv[:b], kv[:b], v[:b], g[:b], beta[:b], pool.index_select(0, slots)))
    print(f"{cpu_model()}, {a.threads} threads")
    print_table(rows, ["op", "load", "c_ms", "reference_ms", "speedup"])
    print(write_result("delta_rule_kernels", {"cpu": cpu_model(), "threads": a.threads, "args": vars(a), "rows": rows}))


if __name__ == "__main__":
    main()
