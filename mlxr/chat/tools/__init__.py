"""Tool calling: the formats families write calls in (one module each, in a registry tried in
the order imported here: the more specific before those whose markers they share), the
messages a template is given, and the splitter that reads calls out of a reply."""
from mlxr.chat.tools import harmony_format, generic, qwen3_xml, glm45, hermes, kimi_k2, deepseek31  # noqa: F401, I001
from mlxr.chat.tools import gemma_calls, granite, pythonic, llama3, mistral  # noqa: F401 - each registers its format
from mlxr.chat.tools.calls import ToolCall, new_call_id
from mlxr.chat.tools.choice import format_for_template
from mlxr.chat.tools.formats import ToolFormat, format_named, registered
from mlxr.chat.tools.json_stream import Partial
from mlxr.chat.tools.messages import template_messages
from mlxr.chat.tools.splitter import CallSplitter, Piece

__all__ = ["CallSplitter", "Partial", "Piece", "ToolCall", "ToolFormat", "format_for_template", "format_named",
           "new_call_id", "registered", "template_messages"]
