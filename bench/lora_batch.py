"""Mixed-adapter decode: a batch of B requests spread over N LoRA adapters and the base, beside
the same engine's batch of B base requests, rounds interleaved; the figure is the ratio of
decode tok/s (mixed / base). Adapters are random PEFT directories of rank R on every projection,
written once under .fixtures/lora-bench/. JSON to bench/results/<day>/lora_batch-*.json.

  python bench/lora_batch.py --device cuda                       # TinyLlama shape, batch 64, 4 adapters
  python bench/lora_batch.py --device cpu --model tiny-llama --batch 8 --gen-len 32
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from common import cpu_model, device_name, median, print_table, sync, write_result
from latency import model_paths

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(hf_dir: str, rank: int, seed: int) -> Path:
    """A PEFT directory of rank `rank` on every projection of the base (random A and B)."""
    from safetensors.numpy import save_file

    config = json.loads((Path(hf_dir) / "config.json").read_text())
    out = ROOT / ".fixtures" / "lora-bench" / f"{Path(hf_dir).parent.name}-r{rank}-s{seed}"
    if (out / "adapter_model.safetensors").is_file():
        return out
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    g = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        for t in TARGETS:
            part = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            name = f"base_model.model.model.layers.{i}.{part}.{t}"
            n_out, n_in = shapes[t]
            tensors[f"{name}.lora_A.weight"] = (g.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = (g.standard_normal((n_out, rank)) * 0.01).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                         "target_modules": list(TARGETS)}))
    return out


def decode_rate(llm, loras: list[str], prompts: list[list[int]], gen: int, device: str) -> float:
    """Decode tok/s of one batch (from the step every request had its first token on)."""
    from mlxr import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    for i, (ids, name) in enumerate(zip(prompts, loras)):
        engine.add_request(f"lb-{time.monotonic_ns()}-{i}", ids, params, stream_deltas=True, lora_name=name)
    started, generated, t_all, gen_at = set(), 0, None, 0
    while engine.has_unfinished():
        for out in engine.step():
            k = len(out.outputs[0].token_ids) if out.outputs else 0
            generated += k
            if k:
                started.add(out.request_id)
        if t_all is None and len(started) == len(prompts):
            sync(device)
            t_all, gen_at = time.perf_counter(), generated
    sync(device)
    return (generated - gen_at) / max(1e-9, time.perf_counter() - t_all)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a fixture config name (default: tinyllama-shape on cuda, tiny-llama on cpu)")
    ap.add_argument("--batch", type=int, default=None, help="requests per batch (default 64 on cuda, 8 on cpu)")
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=None, help="tokens per request (default 256 cuda, 32 cpu)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    model = args.model or ("tinyllama-shape" if cuda else "tiny-llama")
    batch, gen = args.batch or (64 if cuda else 8), args.gen_len or (256 if cuda else 32)
    ref, _ = model_paths(model)
    from mlxr import LLM

    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    llm = LLM(ref, device=args.device, dtype=dtype, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
              max_num_seqs=max(64, batch), engine_process=False)
    names = [f"a{i}" for i in range(args.adapters)]
    for i, name in enumerate(names):
        llm.load_lora(name, str(random_adapter(ref, args.rank, i)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, llm.args.vocab_size - 10, (args.prompt_len,), generator=g).tolist() for _ in range(batch)]
    mixed = [([*names, ""] * batch)[i] for i in range(batch)]  # adapters and the base in turn
    # The base model served without LoRA: what the "base model's speed" is.
    plain = LLM(ref, device=args.device, dtype=dtype, max_num_seqs=max(64, batch), engine_process=False)
    decode_rate(llm, mixed, prompts[:4], 8, args.device)  # warm both paths
    decode_rate(llm, [""] * 4, prompts[:4], 8, args.device)
    decode_rate(plain, [None] * 4, prompts[:4], 8, args.device)
    base_rates, mixed_rates, plain_rates = [], [], []
    for _ in range(args.rounds):  # interleaved: the host's load changes all alike
        plain_rates.append(decode_rate(plain, [None] * batch, prompts, gen, args.device))
        base_rates.append(decode_rate(llm, [""] * batch, prompts, gen, args.device))
        mixed_rates.append(decode_rate(llm, mixed, prompts, gen, args.device))
    plain.shutdown()
    ratios = [m / b for m, b in zip(mixed_rates, base_rates)]
    to_plain = [m / p for m, p in zip(mixed_rates, plain_rates)]
    rows = [{"batch": "base, LoRA off", "decode_tok_s": median(plain_rates)},
            {"batch": "base, LoRA on", "decode_tok_s": median(base_rates),
             "ratio": round(median([b / p for b, p in zip(base_rates, plain_rates)]), 3)},
            {"batch": f"{args.adapters} adapters + base", "decode_tok_s": median(mixed_rates),
             "ratio": round(median(to_plain), 3)}]
    payload = {"device": device_name(args.device), "cpu": cpu_model(), "model": model, "dtype": dtype,
               "batch": batch, "adapters": args.adapters, "rank": args.rank, "gen_len": gen,
               "prompt_len": args.prompt_len, "base_tok_s": base_rates, "mixed_tok_s": mixed_rates,
               "plain_tok_s": plain_rates, "ratio_median": median(ratios), "ratio_to_plain_median": median(to_plain),
               "rounds": args.rounds}
    path = write_result("lora_batch", payload)
    print(f"{payload['device']}, {model} {dtype}, batch {batch}, rank {args.rank}; wrote {path}")
    print_table(rows, ["batch", "decode_tok_s", "ratio"])
    llm.shutdown()


if __name__ == "__main__":
    main()
