"""`mlxr serve --speculative-method eagle3 --speculative-model HEAD` and `--speculative-method
mtp` (the served directory's own MTP layer) through the official openai client: the greedy
completion is the plain engine's, and the drafts show in vLLM's metrics."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from model_fixtures import cached_llm, fixture_model
from server_harness import running_server
from mlxr import SamplingParams
from mlxr.testing.head_fixtures import write_eagle3_head, write_mtp_target

PROMPT = [5, 9, 17, 33, 5, 9, 17, 33, 5, 9]


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_serve_with_a_head_proposer(tmp_path, kind):
    target = fixture_model("tiny-llama").hf_dir
    if kind == "eagle3":
        head = write_eagle3_head(target, tmp_path / "head", seed=1, draft_vocab_size=256)
        args = ["--model", str(target), "--speculative-method", "eagle3", "--speculative-model", str(head)]
    else:
        target = write_mtp_target(target, tmp_path / "with-mtp", seed=2)
        args = ["--model", str(target), "--speculative-method", "mtp"]  # its own directory's mtp.* tensors
    want = cached_llm(str(target)).generate([PROMPT], SamplingParams(max_tokens=24, temperature=0))[0].outputs[0].text
    with running_server(tmp_path / "home", *args, "--num-speculative-tokens", "3") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        name = client.models.list().data[0].id
        got = client.completions.create(model=name, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
        metrics = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}
    assert got == want
    drafted = sum(s.value for s in metrics["vllm:spec_decode_num_draft_tokens"].samples if s.name.endswith("_total"))
    assert drafted > 0
