"""`mlxr serve --kv-events-endpoint`: a completion's prompt blocks reach a ZMQ subscriber as
vLLM-format BlockStored events carrying the prompt's token ids, and /metrics carries the vLLM
info gauges a fleet router reads (vllm:cache_config_info, vllm:lora_requests_info) and the e2e
latency histogram on vLLM's buckets."""
from __future__ import annotations

import httpx
import msgspec
import openai
import zmq
from prometheus_client.parser import text_string_to_metric_families

from server_harness import free_port, tiny_llama_server

PROMPT = list(range(5, 69))  # 4 full blocks of 16
VLLM_E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def families(base_url: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(base_url + "/metrics").text)}


def stored_tokens(sub: zmq.Socket) -> list[list[int]]:
    """token_ids of every BlockStored event received, decoded as plain msgpack arrays
    ([ts, [[tag, fields...], ...], rank]: vLLM's array_like layout)."""
    out = []
    while sub.poll(1500):
        _topic, _seq, payload = sub.recv_multipart()
        ts, events, rank = msgspec.msgpack.decode(payload)
        assert isinstance(ts, float) and rank == 0
        out += [event[3] for event in events if event[0] == "BlockStored"]
    return out


def test_events_and_vllm_info_metrics(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        with tiny_llama_server(tmp_path / "home", "--num-kv-blocks", "48", "--kv-events-endpoint", endpoint) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
            name = client.models.list().data[0].id
            client.completions.create(model=name, prompt=PROMPT, max_tokens=2, temperature=0)
            tokens = [t for block in stored_tokens(sub) for t in block]
            assert tokens[:len(PROMPT)] == PROMPT
            metrics = families(url)
        [cache] = metrics["vllm:cache_config_info"].samples
        assert cache.value == 1.0
        assert {k: cache.labels[k] for k in ("model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching",
                                            "cache_dtype", "num_cpu_blocks")} == {
            "model_name": name, "block_size": "16", "num_gpu_blocks": "48", "enable_prefix_caching": "True",
            "cache_dtype": "auto", "num_cpu_blocks": "0"}
        [lora] = metrics["vllm:lora_requests_info"].samples
        assert lora.labels == {"model_name": name, "max_lora": "0", "running_lora_adapters": "",
                               "waiting_lora_adapters": ""} and lora.value > 1.7e9
        e2e = metrics["vllm:e2e_request_latency_seconds"].samples
        buckets = [float(s.labels["le"]) for s in e2e if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]
        assert buckets == VLLM_E2E_BUCKETS
        assert [s.value for s in e2e if s.name.endswith("_count")] == [1.0]
    finally:
        sub.close(linger=0)
