"""`mlxr run`: an interactive terminal chat that streams tokens as they are generated."""
from __future__ import annotations

import sys

from mlxr.types import SamplingParams


def chat_loop(model: str, params: SamplingParams, system: str | None, dtype, device, quantization=None) -> int:
    from mlxr.llm import LLM

    llm = LLM(model, dtype=dtype, device=device, quantization=quantization)
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    print(f"mlxr: chatting with {model}. Ctrl-D or /bye to quit.", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/bye", "/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = stream_reply(llm, messages, params, f"chat-{turn}")
        messages.append({"role": "assistant", "content": reply})
        turn += 1


def stream_reply(llm, messages: list[dict], params: SamplingParams, request_id: str) -> str:
    """Print the reply delta by delta; returns the whole reply."""
    prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    engine = llm.engine
    engine.add_request(request_id, ids, params, stream_deltas=True)
    parts: list[str] = []
    try:
        while engine.has_unfinished():
            for out in engine.step():
                delta = out.outputs[0].text if out.outputs else ""
                parts.append(delta)
                print(delta, end="", flush=True)
    except KeyboardInterrupt:
        engine.abort(request_id)
    print()
    return "".join(parts)
