"""LangChain against the server: ChatOpenAI on the OpenAI API and ChatOllama on the Ollama API,
each with `bind_tools` (a call read as LangChain's tool_calls, then the tool's ToolMessage sent
back and answered) and `with_structured_output` (a pydantic model). ChatOpenAI forces the tool
with tool_choice; Ollama has no tool_choice, so ChatOllama's call comes from `format`, a JSON
schema of the call (the template's format reads a JSON call as a call)."""
from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from client_server import MODEL, call_schema


class City(BaseModel):
    """A city and its population."""
    # Closed, as OpenAI's strict schemas are: without additionalProperties false the grammar
    # lets the model add keys of its own without end.
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=10_000_000)


class OpenCity(BaseModel):
    """A city, as pydantic writes a model by default: no additionalProperties."""
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=10_000_000)


class WeatherArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)


@tool(args_schema=WeatherArgs)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


WEATHER_CALL = call_schema("get_weather", WeatherArgs.model_json_schema())


@pytest.fixture(scope="module")
def chat_models(client_server_url) -> dict[str, object]:
    return {"openai": ChatOpenAI(model=MODEL, base_url=client_server_url + "/v1", api_key="unused",
                                 temperature=0, max_tokens=80, max_retries=0),
            "ollama": ChatOllama(model=MODEL, base_url=client_server_url, temperature=0, num_predict=80)}


def tool_bound(chat_models, api: str):
    if api == "openai":
        return chat_models["openai"].bind_tools([get_weather], tool_choice="get_weather")
    return chat_models["ollama"].bind_tools([get_weather], format=WEATHER_CALL)


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_bind_tools_call_then_tool_message_then_an_answer(chat_models, api):
    ask = [HumanMessage("What is the weather in Paris?")]
    reply = tool_bound(chat_models, api).invoke(ask)
    (call,) = reply.tool_calls
    assert not reply.invalid_tool_calls and call["name"] == "get_weather" and call["id"]
    assert WeatherArgs.model_validate(call["args"])
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    answer = chat_models[api].bind_tools([get_weather]).invoke([*ask, reply, result])
    assert answer.content and not answer.tool_calls
    assert answer.response_metadata.get("finish_reason", answer.response_metadata.get("done_reason")) in (
        "stop", "length")


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_bind_tools_streamed_call_equals_the_whole_one(chat_models, api):
    bound = tool_bound(chat_models, api)
    whole = bound.invoke("Weather?")
    chunks = list(bound.stream("Weather?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    assert len(whole.tool_calls) == 1


# Not ChatOllama's function_calling: Ollama has no tool_choice to force the call with.
@pytest.mark.parametrize(("api", "method"), [("openai", "json_schema"), ("openai", "function_calling"),
                                             ("ollama", "json_schema")])
def test_with_structured_output_gives_the_pydantic_model(chat_models, api, method):
    city = chat_models[api].with_structured_output(City, method=method).invoke("Name a city.")
    assert isinstance(city, City)


def test_a_forced_call_on_an_open_pydantic_model_ends(chat_models):
    # A forced call's parameters are closed where they say nothing of other properties: open,
    # the grammar let the model add keys of its own until max_tokens (the call came back cut).
    city = chat_models["openai"].with_structured_output(OpenCity, method="function_calling").invoke("Name a city.")
    assert isinstance(city, OpenCity)
