"""pydantic-ai Agents against the server: a structured result type (pydantic-ai's output tool,
forced with tool_choice required) and a function tool, called, answered and followed by the
result, through pydantic-ai's OpenAI and Ollama providers and its Anthropic model. The Ollama
provider speaks Ollama's OpenAI-compatible /v1, as pydantic-ai has no client of Ollama's own API.
The first step forces the function tool (a capability's per-step settings, as pydantic-ai
documents for it); a random model would not call it of itself."""
from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.ollama import OllamaProvider
from pydantic_ai.providers.openai import OpenAIProvider

from client_server import MODEL

SETTINGS = {"temperature": 0.0, "max_tokens": 100}


class City(BaseModel):
    # Open, as pydantic writes it (pydantic-ai's Anthropic model sends it so): the forced
    # output call closes it, or the model would add keys of its own until max_tokens.
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=10_000_000)


class FirstStepCallsWeather(AbstractCapability):
    def get_model_settings(self):
        return lambda ctx: {"tool_choice": ["get_weather"]} if ctx.run_step == 1 else {}


def model_for(api: str, url: str):
    if api == "anthropic":
        return AnthropicModel(MODEL, provider=AnthropicProvider(base_url=url, api_key="unused"))
    provider = OpenAIProvider(base_url=url + "/v1", api_key="unused") if api == "openai" else \
        OllamaProvider(base_url=url + "/v1")
    return OpenAIChatModel(MODEL, provider=provider)


APIS = ["openai", "ollama", "anthropic"]


@pytest.mark.parametrize("api", APIS)
def test_agent_gives_a_structured_result(client_server_url, api):
    result = Agent(model_for(api, client_server_url), output_type=City, model_settings=SETTINGS).run_sync("A city?")
    assert isinstance(result.output, City)


@pytest.mark.parametrize("api", APIS)
def test_agent_calls_a_tool_then_gives_its_result(client_server_url, api):
    seen = []

    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        seen.append(city)
        return "sunny, 18 C"

    agent = Agent(model_for(api, client_server_url), output_type=City, tools=[get_weather],
                  capabilities=[FirstStepCallsWeather()], model_settings=SETTINGS)
    result = agent.run_sync("What is the weather in Paris?")
    parts = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolCallPart | ToolReturnPart)]
    assert [(type(p).__name__, p.tool_name) for p in parts] == [
        ("ToolCallPart", "get_weather"), ("ToolReturnPart", "get_weather"),
        ("ToolCallPart", "final_result"), ("ToolReturnPart", "final_result")]
    assert seen == [parts[0].args_as_dict()["city"]] and parts[1].content == "sunny, 18 C"
    assert isinstance(result.output, City)
