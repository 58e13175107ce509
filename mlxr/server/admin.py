"""GET /admin/stats and GET /metrics: what the engines are doing, for people and Prometheus;
GET /admin/loading: the models being loaded now, for the web UI's loading state."""
from __future__ import annotations

import asyncio
import time

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mlxr.server.model_manager import ModelManager
from mlxr.types import EngineStats

router = APIRouter(tags=["admin"])


def engine_snapshot(models: ModelManager) -> dict[str, EngineStats]:
    """Stats of every loaded engine. Blocks while a step runs: call it off the event loop."""
    return {name: served.engine.stats() for name, served in list(models.served.items())}


def replica_health(models: ModelManager) -> dict[str, list[dict]]:
    """--data-parallel-size N: per model, each replica's state (a dead one restarts in the background)."""
    return {name: [{"replica": int(r), "up": bool(f["up"]), "restarts": f["restarts"], "pid": f["pid"], "running": f["running"],
                    "waiting": f["waiting"]} for r, f in sorted(s.data_parallel.items(), key=lambda kv: int(kv[0]))]
            for name, s in engine_snapshot(models).items()}


@router.get("/admin/stats")
async def admin_stats(request: Request) -> JSONResponse:
    models: ModelManager = request.app.state.models
    stats = await asyncio.to_thread(engine_snapshot, models)
    body = {}
    for name, s in stats.items():
        served = models.served.get(name)
        body[name] = {
            **msgspec.structs.asdict(s),
            "kv_cache_usage": s.kv_cache_usage,
            "spec_acceptance_rate": s.spec_acceptance_rate,
            "kv_blocks_free": s.kv_blocks_total - s.kv_blocks_used,
            "active_http_requests": served.active if served else 0,
            "context_length": served.context_length if served else None,
        }
    # Under --api-servers N each process counts its own requests (finished_by_reason, tokens,
    # aborts, active_http_requests); the engine gauges are the shared core's.
    return JSONResponse({"models": body, "api_server": request.app.state.api_server})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    data = await asyncio.to_thread(request.app.state.metrics.exposition)
    return Response(data, media_type=CONTENT_TYPE_LATEST)


@router.get("/admin/loading")
async def admin_loading(request: Request) -> JSONResponse:
    """Each model whose load is under way: its stage (waiting for a loaded model to go idle and make
    room, or loading), the seconds since it began and since its stage began, and how long its previous load took (null
    before the first; the loader reports no finer progress)."""
    models: ModelManager = request.app.state.models
    now = time.time()
    body = [{"name": name, "stage": state["stage"], "started_at": state["started_at"],
             "elapsed_s": round(now - state["started_at"], 3), "stage_elapsed_s": round(now - state["stage_at"], 3),
             "previous_load_s": models.last_load_s.get(name)}
            for name, state in list(models.loading.items())]
    return JSONResponse({"models": body})
