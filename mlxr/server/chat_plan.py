"""What a chat request asks beyond text, decided once for OpenAI, Ollama and the Responses API:
the tool format (from the template), the grammar a forced call decodes under, whether the
model thinks, and the prompt text rendered with all of that. reply_parser.py reads the reply
back with the same plan."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from mlxr.chat.reasoning import ThinkMarkers, markers_for_template, template_toggles_thinking
from mlxr.chat.tools import ToolFormat, format_for_template, template_messages
from mlxr.chat.tools.harmony_format import HARMONY
from mlxr.chat.tools.calls import MAX_CALLS
from mlxr.engine.structured.check_process import GrammarBudgetError, check_bounded
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams

# chat_template: a template sent in the request is refused, as vLLM does (the model's own renders).
_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "chat_template"})
MAX_TEMPLATE_KWARGS = 32
MAX_TOOLS = 128  # tools in one request (OpenAI's limit): a forced call's grammar checks each


@dataclass
class ChatPlan:
    fmt: ToolFormat | None = None  # None: the reply is not searched for calls
    forced: bool = False  # the reply is a call under a grammar (tool_choice required / named)
    constraint: StructuredOutputsParams | None = None
    markers: ThinkMarkers | None = None  # None: no reasoning to split off
    prompt_text: str = ""
    tool_names: list[str] = field(default_factory=list)
    tool_params: dict[str, Any] = field(default_factory=dict)  # name -> parameters schema
    max_calls: int = MAX_CALLS  # 1 where parallel_tool_calls is false
    # (field, a forced tool's own call schema): checked one by one when the union fails, to name the tool
    call_schemas: list[tuple[str, StructuredOutputsParams]] = field(default_factory=list)
    reasoning: tuple[str, str] | None = None  # markers a constrained reply may reason between first
    harmony: bool = False  # gpt-oss: the reply's channels are read by chat/harmony.py

    @property
    def skip_special_tokens(self) -> bool:
        """Harmony's channel markers are special tokens: its replies keep them in the text."""
        return not self.harmony

    def constraint_for(self, other: StructuredOutputsParams | None) -> StructuredOutputsParams | None:
        """The reply's constraint (a forced call's, or the request's own), starting after the
        reasoning where the model thinks."""
        constraint = self.constraint or other
        if constraint is None or self.reasoning is None:
            return constraint
        return replace(constraint, reasoning=self.reasoning)


def _tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def _check_tools(tools: list[dict[str, Any]] | None) -> None:
    if tools is not None and len(tools) > MAX_TOOLS:
        raise InvalidParameterError("tools", f"at most {MAX_TOOLS} tools a request (MAX_TOOLS), got {len(tools)}")
    names = [_tool_function(t).get("name") if isinstance(t, dict) else None for t in tools or []]
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"tools[{i}]", "a tool needs a function name")
    if len(set(names)) != len(names):
        raise InvalidParameterError("tools", "tool names must be unique")


def _choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "named", the named function)."""
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise InvalidParameterError("tool_choice", f"unknown value {tool_choice!r}")
        if tool_choice == "required" and not tools:
            raise InvalidParameterError("tool_choice", "'required' needs tools")
        return tool_choice, None
    name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    names = [_tool_function(t).get("name") for t in tools or []]
    if name not in names:
        raise InvalidParameterError("tool_choice", f"names function {name!r}, which is not among the tools")
    return "named", name


def _call_constraint(fmt: ToolFormat, tools: list[dict[str, Any]], mode: str, name: str | None,
                     parallel: bool | None) -> StructuredOutputsParams:
    functions = [_tool_function(t) for t in tools]
    schemas = {f["name"]: fmt.call_schema(f["name"], f.get("parameters")) for f in functions}
    if mode == "named":
        return StructuredOutputsParams(json=schemas[name])
    if parallel is not True:
        # One call unless the client asks for several: a small model under a list grammar
        # repeats the call until max_tokens (SmolLM2-135M did).
        return StructuredOutputsParams(json={"anyOf": list(schemas.values())})
    return StructuredOutputsParams(json={"type": "array", "minItems": 1, "items": {"anyOf": list(schemas.values())}})


def _call_schemas(fmt: ToolFormat, tools: list[dict[str, Any]],
                  names: list[str]) -> list[tuple[str, StructuredOutputsParams]]:
    functions = [(i, _tool_function(t)) for i, t in enumerate(tools)]
    return [(f"tools[{i}].function.parameters",
             StructuredOutputsParams(json=fmt.call_schema(f["name"], f.get("parameters"))))
            for i, f in functions if f.get("name") in names]


async def check_forced_calls(plan: ChatPlan) -> None:
    """A 400 unless a reply can follow the forced call's grammar: naming the tool whose
    parameters it cannot follow (a schema that matches nothing or never finishes), or `tools`
    when only their union fails. In worker processes, within the request's one grammar-check
    budget (engine/structured/check_process.py); the engine's own check then finds it checked."""
    if not plan.forced or plan.constraint is None:
        return
    try:
        await check_bounded(plan.constraint)
        return
    except GrammarBudgetError:
        raise
    except InvalidParameterError as e:
        problem = _reason(e)
    for param, spec in plan.call_schemas:
        try:
            await check_bounded(spec)
        except GrammarBudgetError:
            raise
        except InvalidParameterError as e:
            raise InvalidParameterError(param, f"as a forced call's schema: {_reason(e)}") from None
    raise InvalidParameterError("tools", f"as the forced calls' schema: {problem}")


def _reason(e: InvalidParameterError) -> str:
    return e.message.removeprefix(f"{e.param}: ")


HARMONY_EFFORTS = ("low", "medium", "high")  # the system message's "Reasoning:" levels


def _template_kwargs(extra: dict[str, Any] | None, thinking: bool | None, toggles: bool,
                     effort: str | None, harmony: bool) -> dict[str, Any]:
    kwargs = dict(extra or {})
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise InvalidParameterError("chat_template_kwargs", f"at most {MAX_TEMPLATE_KWARGS} entries")
    if bad := sorted(_RESERVED & kwargs.keys()):
        raise InvalidParameterError("chat_template_kwargs", f"may not set {bad}")
    if thinking is not None and toggles:
        kwargs["enable_thinking"] = thinking
    if harmony and effort is not None:
        # gpt-oss always reasons: "minimal" and "none" ask for the least it has
        kwargs["reasoning_effort"] = effort if effort in HARMONY_EFFORTS else "low"
    return kwargs


def plan_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
              tool_choice: Any = None, parallel: bool | None = None, thinking: bool | None = None,
              template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
              other_constraint: bool = False, effort: str | None = None) -> ChatPlan:
    """Render the prompt text; raises InvalidParameterError for a bad tool_choice. A forced
    call's grammar is checked after, on the event loop: check_forced_calls. effort: the
    request's reasoning effort, which a harmony template writes into its system message."""
    _check_tools(tools)
    source = tokenizer.template_source
    fmt = format_for_template(source)
    mode, name = _choice(tool_choice, tools)
    harmony = fmt is HARMONY
    if harmony and mode in ("required", "named"):
        raise InvalidParameterError("tool_choice", f"{tool_choice!r} is not supported with gpt-oss's harmony format "
                                                   "(use 'auto' or 'none')")
    plan = ChatPlan(markers=None if harmony else markers_for_template(source), harmony=harmony)
    if mode != "none":
        plan.fmt, plan.tool_names = fmt, [_tool_function(t).get("name", "") for t in tools or []]
        plan.tool_params = {_tool_function(t).get("name", ""): _tool_function(t).get("parameters") or {}
                            for t in tools or []}
        plan.max_calls = 1 if parallel is False else MAX_CALLS
    if mode in ("required", "named"):
        if other_constraint:
            raise InvalidParameterError("tool_choice", f"{tool_choice!r} cannot be combined with another constraint "
                                        "(response_format, text.format or structured_outputs)")
        constraint = _call_constraint(fmt, tools or [], mode, name, parallel)
        forced = [name] if mode == "named" else plan.tool_names
        plan.forced, plan.constraint = True, constraint
        plan.call_schemas = _call_schemas(fmt, tools or [], forced)
    shown, shown_tools = template_messages(messages, fmt, tools if mode != "none" else None)
    kwargs = _template_kwargs(template_kwargs, thinking, template_toggles_thinking(source), effort, harmony)
    plan.prompt_text = tokenizer.apply_chat_template(
        shown, add_generation_prompt=add_generation_prompt, tools=shown_tools, **kwargs)
    if plan.markers is not None and thinking is not False:
        opened = plan.prompt_text.rstrip().endswith(plan.markers.start)
        plan.reasoning = ("" if opened else plan.markers.start, plan.markers.end)
    return plan
