"""/openapi.json as the server really behaves: the Bearer scheme the guard enforces, and the
error answers every route may give (400, not FastAPI's 422, for a bad body)."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from mlxr.server.guards import OPEN_PATHS

_ERROR = {"$ref": "#/components/schemas/Error"}
_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    # OpenAI routes: {"message", "type", "param", "code"}; Ollama routes: a string.
    "properties": {"error": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
}
_ALWAYS = {"403": "Host or Origin not allowed (DNS rebinding and cross-site guard)"}
_WITH_KEY = {"401": "missing or invalid API key"}
_WITH_BODY = {"400": "invalid request: the message names the field", "413": "request body too large",
              "415": "request body is not application/json"}
_GENERATING = {"503": "queue full or model unloading; retry after Retry-After seconds"}


def install_openapi(app: FastAPI, secured: bool) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, secured)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, secured: bool) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    components["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            _describe(operation, path, secured)
    return schema


def _describe(operation: dict[str, Any], path: str, secured: bool) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)  # validation errors are 400 here
    codes = dict(_ALWAYS)
    if path not in OPEN_PATHS:
        operation["security"] = [{"bearerAuth": []}] if secured else [{}, {"bearerAuth": []}]
        if secured:
            codes.update(_WITH_KEY)
    if "requestBody" in operation:
        codes.update(_WITH_BODY)
        codes.update(_GENERATING)
    for code, description in codes.items():
        responses.setdefault(code, {"description": description, "content": {"application/json": {"schema": _ERROR}}})
