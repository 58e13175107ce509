"""Which tool-call format a chat template writes: the first registered format that renders tools
and recognizes the template, else one inferred from the template's own call markers, else the
generic one (tools described in the system prompt)."""
from __future__ import annotations

from mlxr.chat.tools.formats import ToolFormat, registered
from mlxr.chat.tools.generic import GENERIC
from mlxr.chat.tools.inferred import infer_format


def format_for_template(source: str | None) -> ToolFormat:
    """The format of the template `source` (None: no template, the generic format)."""
    for fmt in registered():
        if fmt.renders_tools and source and fmt.detect(source):
            return fmt
    return infer_format(source) or GENERIC
