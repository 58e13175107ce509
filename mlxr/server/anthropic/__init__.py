"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens)."""
from __future__ import annotations

from fastapi import APIRouter

from mlxr.server.anthropic import messages

router = APIRouter(tags=["anthropic"])
router.include_router(messages.router)
