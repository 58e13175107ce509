"""`mlxr serve --data-parallel-size 2` on a tiny Llama: both replicas serve (the placements by
reason and each replica's figures in /metrics, each replica on /health), and a replica's core
killed with SIGKILL mid-stream fails exactly the streams it held: the other replica's finish,
and the killed one is started again."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_harness import tiny_llama_server

pytestmark = pytest.mark.slow  # a server with two core processes, and a restart


def samples(url: str, name: str) -> list:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == name:
            return family.samples
    return []


def placed(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples(url, "mlxr:dp_placements"):
        if s.name.endswith("_total"):
            out[s.labels["replica"]] = out.get(s.labels["replica"], 0) + s.value
    return out


def stream(client: openai.OpenAI, name: str, prompt: list[int], results: dict, key: int, started: threading.Event):
    try:
        chunks = client.completions.create(model=name, prompt=prompt, max_tokens=220, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        n = 0
        for _ in chunks:
            n += 1
            started.set()
        results[key] = ("done", n)
    except Exception as e:  # noqa: BLE001 - the killed replica's streams end with an error
        results[key] = ("error", repr(e))


def test_replicas_serve_and_a_killed_one_fails_only_its_streams(tmp_path):
    with tiny_llama_server(tmp_path / "home", "--data-parallel-size", "2") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        name = client.models.list().data[0].id
        health = httpx.get(url + "/health").json()
        assert [r["up"] for r in health["replicas"][name]] == [True, True]
        assert sorted(s.labels["engine"] for s in samples(url, "vllm:cache_config_info")) == ["0", "1"]
        before = placed(url)
        prompts = [[(7 * k + 3 * i) % 500 + 5 for i in range(24 + k)] for k in range(6)]
        results: dict[int, tuple] = {}
        started = threading.Event()
        threads = [threading.Thread(target=stream, args=(client, name, p, results, k, started))
                   for k, p in enumerate(prompts)]
        for t in threads:
            t.start()
        assert started.wait(60)  # tokens are flowing: the replicas are mid-generation
        os.kill(health["replicas"][name][0]["pid"], signal.SIGKILL)
        for t in threads:
            t.join(120)
        on_victim = placed(url).get("0", 0) - before.get("0", 0)
        errors = [k for k, (kind, _) in results.items() if kind == "error"]
        # the streams the victim held failed; the others (on replica 1, or placed after the kill) finished whole
        assert len(results) == 6 and 0 < len(errors) <= on_victim < 6, (results, on_victim)
        assert all(results[k] == ("done", results[k][1]) and results[k][1] > 1 for k in results if k not in errors)
        deadline = time.monotonic() + 120
        while not httpx.get(url + "/health").json()["replicas"][name][0]["up"]:
            assert time.monotonic() < deadline, "replica 0 did not come back"
            time.sleep(0.5)
        assert client.completions.create(model=name, prompt=prompts[0], max_tokens=4, temperature=0).choices[0].text
        up = {s.labels["replica"]: s.value for s in samples(url, "mlxr:dp_replica_up")}
        assert up == {"0": 1.0, "1": 1.0}


def test_replicas_behind_several_api_processes_give_one_servers_greedy_outputs(tmp_path):
    """--data-parallel-size 2 --api-servers 2: two API processes, each placing its requests on
    both replicas (one channel to each core); the greedy outputs are a one-core server's, and
    each API process reports both replicas up. A replica's core killed while idle is noticed
    before the next request is placed (none fails) and the supervisor starts it again."""
    prompts = [[(7 * k + 3 * i) % 500 + 5 for i in range(24 + k)] for k in range(8)]

    def greedy(url: str) -> list[str]:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        name = client.models.list().data[0].id
        return [client.completions.create(model=name, prompt=p, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text for p in prompts]

    with tiny_llama_server(tmp_path / "one") as url:
        expected = greedy(url)
    with tiny_llama_server(tmp_path / "dp", "--data-parallel-size", "2", "--api-servers", "2") as url:
        assert greedy(url) == expected
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        for _ in range(10):  # each a new connection: either API process answers
            with httpx.Client() as fresh:
                replicas = fresh.get(url + "/health").json()["replicas"][name]
            assert [r["up"] for r in replicas] == [True, True], replicas
        os.kill(replicas[0]["pid"], signal.SIGKILL)
        assert greedy(url) == expected  # each request placed on a live replica
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with httpx.Client() as fresh:
                back = fresh.get(url + "/health").json()["replicas"][name]
            if back[0]["up"] and back[0]["pid"] != replicas[0]["pid"]:
                break
            time.sleep(0.5)
        assert back[0]["up"] and back[0]["restarts"] == 1 and back[0]["pid"] != replicas[0]["pid"], back
