"""Subcommands (placeholder until implemented)."""
from __future__ import annotations


def register(sub) -> dict:
    return {}
