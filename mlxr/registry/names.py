"""Model names: `name:tag`, `namespace/name:tag` or `host/namespace/name:tag` (a pulled
`hf.co/owner/repo:quant`), validated before anything else sees them.

A name is only ever a database key, never a path; the rules still refuse anything that
looks like one, so a later blob store keyed by name cannot be walked out of its directory.
"""
from __future__ import annotations

import re

from mlxr.errors import InvalidParameterError

DEFAULT_TAG = "latest"
_PART = r"[a-z0-9][a-z0-9._-]{0,127}"
_NAME_RE = re.compile(rf"(?:{_PART}/){{0,2}}{_PART}(?::{_PART})?")
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_MAX_NAME = 300


def parse_name(name: object, param: str = "name") -> str:
    """The canonical `name:tag` form of a user-supplied name (tag defaults to "latest").
    Raises InvalidParameterError naming `param` for anything else."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidParameterError(param, f"invalid model name {name!r}: {problem}")
    assert isinstance(name, str)
    return name if ":" in name else f"{name}:{DEFAULT_TAG}"


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid model name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "it must be a non-empty string"
    if len(name) > _MAX_NAME:
        return f"it is longer than {_MAX_NAME} characters"
    if "\0" in name or "\\" in name or ".." in name:
        return "it must not contain NUL, backslashes or '..'"
    if not _NAME_RE.fullmatch(name):
        return ("use lowercase letters, digits, '.', '_' and '-', starting with a letter or "
                "digit, as name, name:tag, namespace/name:tag or host/namespace/name:tag")
    return None


def default_name(stem: str) -> str:
    """A valid `name:latest` derived from a file or directory name."""
    base = _UNSAFE.sub("-", stem.lower()).strip("._-")
    base = re.sub(r"\.{2,}", ".", base)[:128].rstrip("._-") or "model"
    return parse_name(base)
