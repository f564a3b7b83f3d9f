"""Prometheus's scrape target."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import generate_latest

from gpumux.server.metrics import Metrics

router = APIRouter(tags=["metrics"])

# What generate_latest() writes: the classic text format, whatever the client library's version.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Trials by state, queue wait and duration, devices and their load, scheduler tick time."""
    metrics_: Metrics = request.app.state.metrics
    return Response(generate_latest(metrics_.registry), media_type=TEXT_FORMAT)
