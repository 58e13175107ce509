"""Llama 3.1-3.3: a JSON object `{"name": ..., "parameters": {...}}` as the whole reply, after
`<|python_tag|>` in some versions (a special token, so usually gone from the text)."""
from mlxr.chat.tools.formats import ToolFormat, register

LLAMA3 = register(ToolFormat(
    name="llama3_json", starts=("<|python_tag|>",), end=None, bare_json=True, args_key="parameters",
    detect=lambda template: "<|eot_id|>" in template and ("tools" in template or "<|python_tag|>" in template),
))
