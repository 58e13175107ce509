"""KV cache tiers across real processes: the disk tier after a restart, a process killed with
SIGKILL while it writes, and the tiers' figures on a real server's /metrics and /admin/stats."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import torch

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from server_harness import ROOT, running_server

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPT = list(range(5, 205))

GENERATE = """
import json, sys, torch
from mlxr import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype=torch.float32, kv_cache_dir=sys.argv[2])
out = llm.generate([list(range(5, 205))], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
llm.shutdown()  # waits for the disk writes
stats = llm.engine.stats()
print(json.dumps({"tokens": out.outputs[0].token_ids, "hit_tokens": stats.prefix_cache_hit_tokens,
                  "disk": stats.kv_tiers["disk"]}))
"""

# Writes block after block (each prompt new) until killed.
WRITE_FOREVER = """
import sys, torch
from mlxr import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype=torch.float32, kv_cache_dir=sys.argv[2], num_kv_blocks=64)
print("ready", flush=True)
i = 0
while True:
    prompt = [(i * 7 + j) % 500 + 5 for j in range(240)]
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    i += 1
"""


def python(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, **kwargs)


def generate_in_new_process(model: str, cache_dir: Path) -> dict:
    proc = python("-c", GENERATE, model, str(cache_dir), stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_disk_tier_restores_after_restart(tmp_path):
    model = str(fixture_model("tiny-llama").hf_dir)
    cold = generate_in_new_process(model, tmp_path)
    assert cold["hit_tokens"] == 0 and cold["disk"]["bytes_written"] > 0
    warm = generate_in_new_process(model, tmp_path)
    assert warm["tokens"] == cold["tokens"]
    assert warm["hit_tokens"] == 192 and warm["disk"]["hits"] == 12 and warm["disk"]["skipped_files"] == 0


def test_kill_during_writes_leaves_a_readable_cache(tmp_path):
    """SIGKILL lands while a block file is being written (a temporary file is seen); the next
    process finds every indexed block whole and serves from it."""
    model = str(fixture_model("tiny-llama").hf_dir)
    killed_mid_write = False
    for _attempt in range(5):
        proc = python("-c", WRITE_FOREVER, model, str(tmp_path), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 60
            # Some blocks whole first (so there is something to read back), then one mid-write.
            while time.monotonic() < deadline and (len(list(tmp_path.glob("*/*.kvb"))) < 20
                                                   or not list(tmp_path.glob("*/*.tmp"))):
                assert proc.poll() is None, "the writing process died on its own"
                time.sleep(0.001)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        if list(tmp_path.glob("*/*.tmp")):
            killed_mid_write = True
            break
    assert killed_mid_write, "never caught the writer with a temporary file open"
    llm = LLM(model, dtype=torch.float32, kv_cache_dir=str(tmp_path))
    try:
        disk = llm.engine.core.core.tiers.disk
        assert not list(tmp_path.glob("*/*.tmp"))  # swept at start
        assert disk.num_blocks > 0
        assert all(disk.read(h) is not None for h in list(disk._resident))
        assert disk.counters.skipped_files == 0
        prompt = [j % 500 + 5 for j in range(240)]
        got = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    finally:
        llm.shutdown()
    plain = LLM(model, dtype=torch.float32, enable_prefix_caching=False)
    try:
        assert plain.generate([prompt], GREEDY)[0].outputs[0].token_ids == got
    finally:
        plain.shutdown()


def tier_metric(text: str, name: str, tier: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'tier="{tier}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for tier {tier} not in /metrics")


def test_server_reports_tier_hits(tmp_path):
    gguf = str(fixture_model("tiny-llama").gguf_path)
    args = ("--model", gguf, "--num-kv-blocks", "20", "--kv-host-cache-gb", "0.01",
            "--kv-cache-dir", str(tmp_path / "kv"))
    with running_server(tmp_path / "home", *args) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        name = client.models.list().data[0].id
        texts = []
        for prompt in (PROMPT, list(range(300, 500)), PROMPT):
            r = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
            texts.append(r.choices[0].text)
        assert texts[0] == texts[2]
        metrics = httpx.get(url + "/metrics").text
        assert tier_metric(metrics, "mlxr:kv_tier_hits_total", "host") >= 5
        assert tier_metric(metrics, "mlxr:kv_tier_written_bytes_total", "disk") > 0
        assert tier_metric(metrics, "mlxr:kv_tier_writes_enabled", "disk") == 1
        stats = httpx.get(url + "/admin/stats").json()["models"]
        tiers = next(iter(stats.values()))["kv_tiers"]
        assert tiers["host"]["hits"] >= 5 and tiers["disk"]["blocks"] > 0
