"""Defects of the fuzzing pass (2026-11-28), each against a real `mlxr serve` on 127.0.0.1."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import httpx
import ollama
import openai
import pytest
from server_harness import server_log, tiny_llama_server

MAX_WAITING = 2


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with tiny_llama_server(home, "--max-waiting", str(MAX_WAITING), fixture="tiny-llama-long") as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(base_url):
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    yield c
    c.close()


def test_prompt_batch_over_queue_limit_is_a_400_naming_the_limit(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=["a", "b", "c"], max_tokens=2)
    assert err.value.status_code == 400
    assert "--max-waiting" in err.value.message and str(MAX_WAITING) in err.value.message
    assert err.value.body["param"] == "prompt"
    # A batch at the limit is still served.
    ok = client.completions.create(model=model, prompt=["a", "b"], max_tokens=2)
    assert len(ok.choices) == 2



@pytest.mark.parametrize("field, value", [("background", True), ("truncation", "auto")])
def test_responses_refuses_what_a_stateless_server_cannot_do(client, model, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="hi", max_output_tokens=2, **{field: value})
    assert err.value.body["param"] == field and field in err.value.message


def test_responses_truncation_disabled_still_works(client, model):
    reply = client.responses.create(model=model, input="hi", max_output_tokens=2, truncation="disabled")
    assert reply.status in ("completed", "incomplete") and reply.output  # incomplete: max_output_tokens


def test_responses_tool_parameters_not_an_object_is_a_400_on_its_own_path(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="hi", max_output_tokens=2,
                                tools=[{"type": "function", "name": "f", "parameters": "x"}])
    assert err.value.body["param"] == "tools[0].parameters"


def test_responses_tool_schema_errors_name_the_responses_path(client, model):
    never = {"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="hi", max_output_tokens=2, tool_choice="required",
                                tools=[{"type": "function", "name": "f", "parameters": never}])
    assert err.value.body["param"] == "tools[0].parameters", err.value.body


# --- a model that is not loaded while every loaded one is busy --------------------------------
SLOT_WAIT_S = 2.0


@pytest.fixture(scope="module")
def slots_home(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slots_url(slots_home):
    # The variable reaches the server through the harness's copy of os.environ.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXR_MODEL_SLOT_WAIT_S", str(SLOT_WAIT_S))
        with tiny_llama_server(slots_home, "--max-loaded-models", "2", "--max-num-seqs", "3",
                               fixture="tiny-llama-long") as url:
            yield url


@pytest.fixture
def busy(slots_url, slots_home):
    """BusyModel(model, streams) on the slots server; every one is closed after the test, and a
    model that never starts streaming fails with the server's log."""
    started: list[BusyModel] = []

    def make(model: str, streams: int) -> BusyModel:
        b = BusyModel(slots_url, model, streams)
        started.append(b)
        if not b.started.acquire(timeout=60):  # loaded, generating
            pytest.fail(f"no stream of {model} started in 60 s; server log:\n{server_log(slots_home)[-6000:]}")
        time.sleep(0.2)  # the others sent and queued
        return b

    yield make
    for b in started:
        b.close()


@pytest.fixture(scope="module")
def three_models(slots_url) -> list[str]:
    client = ollama.Client(host=slots_url, timeout=60)
    first = client.list().models[0].model
    for copy in ("second:latest", "third:latest"):
        client.copy(first, copy)
    return [first, "second:latest", "third:latest"]


class BusyModel:
    """Streamed completions holding a model busy until close() is called: 3,000 tokens each
    (the long-context fixture) outlast any of these tests on however fast a host."""

    def __init__(self, url: str, model: str, streams: int) -> None:
        self.url, self.model = url, model
        self.stop = threading.Event()
        self.started = threading.Semaphore(0)
        self.pool = concurrent.futures.ThreadPoolExecutor(streams)
        self.streams = [self.pool.submit(self._stream) for _ in range(streams)]

    def _stream(self) -> None:
        # ignore_eos (a vLLM extra): the random model would often stop after a few tokens.
        body = {"model": self.model, "prompt": "count", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                self.started.release()
                if self.stop.is_set():
                    return  # leaving the block disconnects: the server aborts the request

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)
        for f in self.streams:
            f.result()


def _generate_in_thread(host: str, model: str) -> concurrent.futures.Future:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(ollama.Client(host=host, timeout=60).generate, model=model, prompt="hi",
                         options={"num_predict": 2})
    pool.shutdown(wait=False)
    return future


def test_third_model_waits_for_a_slot_while_loaded_models_keep_serving(slots_url, three_models, busy):
    first, second, third = three_models
    # --max-num-seqs 3: the first model runs three streams and queues three; the second has
    # room for one more request beside its own.
    busy(first, streams=6)
    second_streams = busy(second, streams=2)
    waiting = _generate_in_thread(slots_url, third)
    time.sleep(0.3)
    assert not waiting.done(), f"no wait for a slot: {waiting.exception() or waiting.result()}"
    quick = ollama.Client(host=slots_url, timeout=60).generate(model=second, prompt="hi",
                                                              options={"num_predict": 1})
    assert quick.done and not waiting.done(), "a loaded model's request waited behind the load"
    second_streams.close()  # the second model goes idle: its slot is the third's
    reply = waiting.result(timeout=60)
    assert reply.done


def test_third_model_gets_503_with_retry_after_when_no_slot_frees_in_time(slots_url, three_models, busy):
    first, second, _ = three_models
    busy(first, streams=15)
    busy(second, streams=15)
    # The third model may be the loaded one left from the test above: a fourth name.
    ollama.Client(host=slots_url, timeout=60).copy(first, "fourth:latest")
    t0 = time.monotonic()
    r = httpx.post(slots_url + "/api/generate", json={"model": "fourth:latest", "prompt": "hi"}, timeout=60)
    waited = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] and "busy" in r.json()["error"]
    assert waited >= SLOT_WAIT_S - 0.5



# --- keep_alive 0 while another request runs ------------------------------------------------
def _loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]]


def test_keep_alive_zero_during_a_generation_unloads_after_it(base_url, model):
    client = ollama.Client(host=base_url, timeout=60)
    # At temperature 0 this prompt runs to num_predict on the random model (no early stop):
    # far longer than the unload request's round trip.
    running = client.generate(model=model, prompt="hello there", stream=True,
                              options={"num_predict": 3000, "temperature": 0})
    first = next(running)
    assert not first.done
    unload = httpx.post(base_url + "/api/generate", json={"model": model, "keep_alive": 0}, timeout=60).json()
    assert unload["done_reason"] == "unload"
    # Still loaded: the running generation holds it (else this test could not tell the fix).
    assert model in _loaded(base_url)
    last = list(running)[-1]
    assert last.done
    deadline = time.monotonic() + 5  # the reaper looks once a second
    while model in _loaded(base_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert model not in _loaded(base_url), "the running request's keep_alive won over the later keep_alive 0"



# --- no lax coercions ---------------------------------------------------------------------------
@pytest.mark.parametrize("route, body, field", [
    ("/v1/completions", {"prompt": [True], "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": "yes"},
     "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": 1},
     "logprobs"),
])
def test_openai_fields_are_not_coerced(base_url, model, route, body, field):
    # The openai client's types forbid these values: raw JSON, as other clients may send.
    r = httpx.post(base_url + route, json={"model": model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(field), r.text


def test_openai_numbers_of_the_right_type_still_work(client, model):
    reply = client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=2, temperature=1, top_p=1)
    assert reply.choices[0].text is not None



@pytest.mark.parametrize("body, field", [
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "stream": False, "raw": 1}, "raw"),
    ({"prompt": "hi", "stream": False, "context": [True]}, "context"),
    ({"prompt": "hi", "stream": False, "options": {"num_predict": "5"}}, "options"),
])
def test_ollama_fields_are_not_coerced(base_url, model, body, field):
    r = httpx.post(base_url + "/api/generate", json={"model": model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"], r.text


def test_ollama_whole_floats_still_count_as_integers(base_url, model):
    reply = ollama.Client(host=base_url, timeout=60).generate(
        model=model, prompt="hi", options={"num_predict": 2.0, "top_k": 40.0}, context=[1, 2])
    assert reply.done



# --- many /admin/logs/stream readers -------------------------------------------------------------
def test_log_stream_readers_are_bounded_and_health_stays_fast(base_url):
    async def run() -> tuple[list[int], list[float], int]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as http:
            async def open_stream():
                r = await http.send(http.build_request("GET", "/admin/logs/stream"), stream=True)
                if r.status_code != 200:
                    await r.aread()
                return r

            streams = await asyncio.gather(*[open_stream() for _ in range(200)])
            try:
                refused = [r for r in streams if r.status_code != 200]
                assert refused and all(r.status_code == 503 and r.headers.get("Retry-After") for r in refused)
                health = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    assert (await http.get("/health")).status_code == 200
                    health.append(time.perf_counter() - t0)
            finally:
                await asyncio.gather(*[r.aclose() for r in streams])
            await asyncio.sleep(0.5)  # the server sees the disconnects and frees the slots
            again = await http.send(http.build_request("GET", "/admin/logs/stream"), stream=True)
            await again.aclose()
            return [r.status_code for r in streams], health, again.status_code

    codes, health, again = asyncio.run(run())
    assert 0 < codes.count(200) < 200
    assert sorted(health)[len(health) // 2] < 0.25, health
    assert again == 200, "closed log streams did not give their slots back"
