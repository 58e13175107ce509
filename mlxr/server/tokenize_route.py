"""POST /admin/tokenize: a model's tokens for a text, for the web UI's tokenizer view.

Each token comes with its own decoded text; special tokens (BOS/EOS) are flagged and decode
to "" so the non-special texts join back to the input for byte-level vocabularies."""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from mlxr.server.ollama.loading import hold

router = APIRouter(tags=["admin"])
MAX_TEXT_CHARS = 100_000


class TokenizeRequest(BaseModel):
    model: str = Field(min_length=1, max_length=512)
    text: str = Field(max_length=MAX_TEXT_CHARS)
    add_special_tokens: bool = True


def _tokens(tokenizer: Any, body: TokenizeRequest) -> list[dict[str, Any]]:
    ids = tokenizer.encode(body.text, add_special_tokens=body.add_special_tokens)
    out = []
    for i in ids:
        text = tokenizer.decode([i], skip_special_tokens=True)
        special = text == "" and tokenizer.decode([i], skip_special_tokens=False) != ""
        out.append({"id": i, "text": text if not special else tokenizer.decode([i], skip_special_tokens=False),
                    "special": special})
    return out


@router.post("/admin/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    held = await hold(request, body.model, "/admin/tokenize", None)
    try:
        tokens = await asyncio.to_thread(_tokens, held.served.tokenizer, body)
    except BaseException as e:
        await held.session.fail(e)
        raise
    await held.finish()
    return {"model": body.model, "count": len(tokens), "tokens": tokens}
