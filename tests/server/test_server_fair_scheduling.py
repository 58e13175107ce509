"""Fair scheduling through the real server (engine/sched/budget.py): a short request sent while
a long prompt is still prefilling gets its first token before the long prompt does, with
the official OpenAI client; vLLM's priority field is taken and checked."""
from __future__ import annotations

import threading
import time

import openai
import pytest
from server_harness import scrape, tiny_llama_server

CHUNK = 16  # tokens a step takes at most: the long prompt needs ~220 steps
LONG = 3500  # tiny-llama-long holds 4,096 tokens


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("home"), "--max-num-batched-tokens", str(CHUNK),
                           fixture="tiny-llama-long") as url:
        yield url


def _first_token_at(client, model: str, prompt: list[int], got: dict, key: str, **extra) -> None:
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0.0, stream=True,
                                       extra_body={"ignore_eos": True, **extra})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text is not None and key not in got:
            got[key] = time.monotonic()
    got[key + " done"] = time.monotonic()


def _running(base_url: str) -> float:
    return sum(v for k, v in scrape(base_url).items() if k.startswith("vllm:num_requests_running"))


def _wait_running(base_url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _running(base_url) < 1:
        assert time.monotonic() < deadline, "the long prompt never started"
        time.sleep(0.005)


def test_a_short_request_answers_while_a_long_prompt_prefills(client, model, base_url):
    got: dict[str, float] = {}
    long = threading.Thread(target=_first_token_at, args=(client, model, [5 + i % 200 for i in range(LONG)], got, "long"))
    long.start()
    try:
        _wait_running(base_url)
        assert "long" not in got  # still prefilling
        _first_token_at(client, model, [7, 8, 9, 10, 11, 12, 13, 14], got, "short")
    finally:
        long.join(120)
    assert got["short"] < got["long"], got  # before: the whole prompt's chunks came first


def test_priority_is_taken_and_out_of_range_is_a_400(client, model):
    out = client.completions.create(model=model, prompt=[5, 6, 7], max_tokens=2, extra_body={"priority": -3})
    assert out.choices[0].finish_reason in ("length", "stop")
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                          extra_body={"priority": 7})
    assert chat.choices[0].message is not None
    for bad in (1 << 40, "high", 1.5):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt=[5, 6], max_tokens=2, extra_body={"priority": bad})
        assert "priority" in str(e.value)


def test_step_time_target_flag_is_checked():
    import argparse

    from mlxr.cli.serve import step_time_target_ms

    assert step_time_target_ms("500") == 500 and step_time_target_ms("0") == 0
    for bad in ("-1", "abc", "60001", "0.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="--step-time-target-ms"):
            step_time_target_ms(bad)
