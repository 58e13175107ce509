"""A constraint that starts after the reasoning: the reply may first think, unconstrained,
between a family's markers (`<think>` ... `</think>`), then follows the grammar. The block is
optional where the reply would open it, and required where the prompt already opened it (the
template ends with the start marker). Built as llguidance's grammar list: a Lark grammar for the
block whose last item is a reference to the request's own grammar. No torch here."""
from __future__ import annotations

import json

BODY = "mlxr_constrained_reply"


def after_reasoning(grammar: str, start: str, end: str) -> str:
    """grammar (llguidance's JSON grammar list, as grammar_text gives it) preceded by a
    reasoning block; start == "": the prompt opened the block, the reply starts inside it."""
    top = json.loads(grammar)
    body = top["grammars"]
    body[0] = {**body[0], "name": BODY}
    thought = f"thought[stop={json.dumps(end)}]: /(?s:.*)/"
    blank = 'BLANK: /[ \\t\\r\\n]*/'
    if start:
        lark = f"start: block? @{BODY}\nblock: {json.dumps(start)} thought BLANK\n{thought}\n{blank}\n"
    else:
        lark = f"start: thought BLANK @{BODY}\n{thought}\n{blank}\n"
    return json.dumps({**top, "grammars": [{"name": "reasoning", "lark_grammar": lark}, *body]})
