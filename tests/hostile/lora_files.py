"""Hostile LoRA adapters made from a good PEFT directory: each breaks one thing (tests/hostile)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def copy_of(good: Path, dest: Path) -> Path:
    shutil.copytree(good, dest)
    return dest


def with_config(good: Path, dest: Path, **changes) -> Path:
    out = copy_of(good, dest)
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(changes)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def with_tensors(good: Path, dest: Path, change) -> Path:
    """change(tensors dict) edits the adapter's tensors in place."""
    out = copy_of(good, dest)
    tensors = load_file(out / "adapter_model.safetensors")
    change(tensors)
    save_file(tensors, out / "adapter_model.safetensors")
    return out


def config_not_json(good: Path, dest: Path) -> Path:
    out = copy_of(good, dest)
    (out / "adapter_config.json").write_text('{"r": 4, "lora_alpha": ')
    return out


def truncated(good: Path, dest: Path) -> Path:
    out = copy_of(good, dest)
    weights = out / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return out


def wrong_shape(good: Path, dest: Path) -> Path:
    def widen(t: dict) -> None:
        name = next(n for n in t if n.endswith("q_proj.lora_A.weight"))
        t[name] = np.zeros((t[name].shape[0], t[name].shape[1] + 8), dtype=np.float32)
    return with_tensors(good, dest, widen)


def no_such_module(good: Path, dest: Path) -> Path:
    def add(t: dict) -> None:
        t["base_model.model.model.layers.0.self_attn.nonexistent_proj.lora_A.weight"] = np.zeros((4, 64), np.float32)
        t["base_model.model.model.layers.0.self_attn.nonexistent_proj.lora_B.weight"] = np.zeros((64, 4), np.float32)
    return with_tensors(good, dest, add)


def rank_bomb_tensors(good: Path, dest: Path, rank: int) -> Path:
    """A config that says r=4 over tensors of a much larger rank."""
    def grow(t: dict) -> None:
        for name in list(t):
            if name.endswith("q_proj.lora_A.weight"):
                t[name] = np.zeros((rank, t[name].shape[1]), np.float32)
            elif name.endswith("q_proj.lora_B.weight"):
                t[name] = np.zeros((t[name].shape[0], rank), np.float32)
    return with_tensors(good, dest, grow)


def gguf_rank_bomb(dest: Path, rank: int, hidden: int = 64) -> Path:
    """A GGUF LoRA whose lora_a claims `rank` rows (checked from the header before any read)."""
    import gguf

    w = gguf.GGUFWriter(str(dest), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((rank, hidden), np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((hidden, rank), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest
