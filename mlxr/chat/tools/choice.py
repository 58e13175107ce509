"""Which tool-call format a chat template writes: the first registered format that renders tools
and recognizes the template, else the generic one (tools described in the system prompt)."""
from __future__ import annotations

from mlxr.chat.tools.formats import ToolFormat, registered
from mlxr.chat.tools.generic import GENERIC


def format_for_template(source: str | None) -> ToolFormat:
    """The format of the template `source` (None: no template, the generic format)."""
    for fmt in registered():
        if fmt.renders_tools and source and fmt.detect(source):
            return fmt
    return GENERIC
