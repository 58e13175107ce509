"""The OpenAI-compatible API (/v1/...)."""
from __future__ import annotations

from fastapi import APIRouter

from mlxr.server.openai import chat, completions, models, responses

router = APIRouter(tags=["openai"])
router.include_router(chat.router)
router.include_router(completions.router)
router.include_router(models.router)
router.include_router(responses.router)
