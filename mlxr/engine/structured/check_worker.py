"""The grammar check's own process (`python -m mlxr.engine.structured.check_worker`): one JSON
line on stdin per check (a StructuredOutputsParams' fields), one JSON line back on stdout, the
grammar text or the error that names the problem. Run apart from the server so a check that
overruns its budget can be stopped (llguidance holds the GIL through a step and cannot be
interrupted from Python): the server kills this process and starts another. No torch here."""
from __future__ import annotations

import json
import sys
from typing import Any

from mlxr.engine.structured.grammar import PARAM, check
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams


def spec_line(spec: StructuredOutputsParams) -> bytes:
    """spec as the one line this process reads (JSON, never pickle)."""
    fields = {"json": spec.json, "json_object": spec.json_object, "regex": spec.regex,
              "choice": spec.choice, "grammar": spec.grammar, "reasoning": spec.reasoning}
    return json.dumps(fields).encode() + b"\n"


def answer(line: str) -> dict[str, Any]:
    """{"text": grammar} when spec passes the check, else {"param", "message"}."""
    try:
        fields = json.loads(line)
        if fields.get("reasoning") is not None:
            fields["reasoning"] = tuple(fields["reasoning"])
        return {"text": check(StructuredOutputsParams(**fields))}
    except InvalidParameterError as e:
        return {"param": e.param or PARAM, "message": e.message.removeprefix(f"{e.param}: ")}
    except Exception as e:  # noqa: BLE001 - llguidance reports a panic as one of several types
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return {"param": PARAM, "message": f"the grammar cannot be checked ({type(e).__name__}: {first})"}


def main() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(answer(line)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
