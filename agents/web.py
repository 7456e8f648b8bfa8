"""The worker's HTTP pages, served by Faust's web server: ``/metrics`` and the KEDA endpoint.

Pages
-----
``GET /metrics``
    flopwatch's figures (``agents.metrics``) in the Prometheus text format.
``GET /keda/<namespace>/<workload>``
    What the decision engine wants for one workload (``agents.decide.scale_view``), as JSON::

        {"namespace": "serving", "workload": "chat", "class": "inference",
         "desired_replicas": 4, "current_replicas": 3, "metric": "qps", "value": 912.5,
         "ts_ns": 1796200000000000000, "stale": false, "decision_id": "..."}

    404 with ``{"error": ...}`` for a workload this worker holds no decision for, 400 when a
    path part is not a Kubernetes name (namespace: a DNS label, at most 63 characters;
    workload: a DNS subdomain, at most 253).
``GET /keda``
    ``{"workloads": [...]}``: every workload this worker holds, in the same shape.

How KEDA reads it
-----------------
A ScaledObject trigger of ``type: metrics-api`` (``deploy/k8s/keda-scaledobject.yaml``)::

    triggers:
      - type: metrics-api
        metricType: AverageValue
        metadata:
          url: "http://<worker>:<port>/keda/<namespace>/<name>"
          format: json
          valueLocation: desired_replicas
          targetValue: "1"
          activationTargetValue: "0"

KEDA sends a plain ``GET`` to ``url``, takes the number at the GJSON path ``valueLocation``
and hands it to the HPA as an external metric with an ``AverageValue`` target of
``targetValue``. The HPA then wants ``ceil(value / targetValue)`` replicas, so with a target
of 1 it wants exactly ``desired_replicas``. Anything but a 200 is an error to KEDA: after
``fallback.failureThreshold`` of them it scales to ``fallback.replicas``; so an unknown
workload answers 404 rather than a made-up number. ``activationTargetValue`` only matters
for scaling from and to zero (the scaler is active while the value exceeds it).

Faust App settings (``WebOptions.app_kwargs``)
----------------------------------------------
``web_enabled``, ``web_bind`` and ``web_port`` come from ``FLOPWATCH_WEB_ENABLED`` (true),
``FLOPWATCH_WEB_BIND`` (127.0.0.1: bind 0.0.0.0 in a pod so KEDA and Prometheus reach it)
and ``FLOPWATCH_WEB_PORT`` (6066). ``web_in_thread`` stays off: the pages read the scale view
and the registry on the worker's event loop, where the agents write them, so no lock is
needed. Faust's own ``/router`` and ``/table`` pages are turned off (flopwatch routes
nothing by table key, and they would publish table data and the cluster's layout);
``web_host`` only feeds Faust's canonical URL for table routing, so it is left alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from faust.web import Request, Response, View

from agents.decide.scale_view import Desired, ScaleView
from agents.metrics import Metrics
from agents.settings import Settings, SettingsError

__all__ = ["WebOptions", "WebOptionsError", "desired_json", "install_web"]

ENV_PREFIX = "FLOPWATCH_WEB_"
JSON = "application/json; charset=utf-8"
# Kubernetes object names: a namespace is an RFC 1123 label, a Deployment name a subdomain.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
NAMESPACE_RE = re.compile(_LABEL)
WORKLOAD_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
NAMESPACE_MAX, WORKLOAD_MAX = 63, 253
DEFAULT_BIND, DEFAULT_PORT = "127.0.0.1", 6066  # loopback unless asked: the pages need no exposure to work locally
_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]+")


class WebOptionsError(ValueError):
    """A FLOPWATCH_WEB_* variable has a value that cannot be used."""


@dataclass(frozen=True, slots=True)
class WebOptions:
    """The worker's web server. Environment: ``FLOPWATCH_WEB_ENABLED``, ``_BIND``, ``_PORT``."""

    enabled: bool = True
    """Serve ``/metrics`` and ``/keda``; default true; FLOPWATCH_WEB_ENABLED."""
    bind: str = DEFAULT_BIND
    """Address to listen on; default 127.0.0.1 (0.0.0.0 in a pod); FLOPWATCH_WEB_BIND."""
    port: int = DEFAULT_PORT
    """TCP port, 1-65535; default 6066 (Faust's); FLOPWATCH_WEB_PORT."""

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise WebOptionsError(f"{ENV_PREFIX}PORT={self.port}: must be 1-65535")
        if not _HOST_RE.fullmatch(self.bind):
            raise WebOptionsError(f"{ENV_PREFIX}BIND={self.bind!r}: expected an IP address or host name")

    @classmethod
    def from_settings(cls, settings: Settings) -> WebOptions:
        """From ``Settings.web_*``; a value that cannot be used is a ``SettingsError`` naming it."""
        try:
            return cls(enabled=settings.web_enabled, bind=settings.web_bind.strip(), port=settings.web_port)
        except WebOptionsError as exc:
            raise SettingsError(str(exc)) from None

    def app_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``faust.App(...)``."""
        return {"web_enabled": self.enabled, "web_bind": self.bind, "web_port": self.port,
                "web_in_thread": False, "web_router_enabled": False, "web_tables_enabled": False}


def desired_json(d: Desired) -> dict[str, Any]:
    """One workload as the KEDA endpoint answers it; a value that is not finite becomes null."""
    return {"namespace": d.namespace, "workload": d.workload, "class": d.workload_class,
            "desired_replicas": d.desired, "current_replicas": d.current, "metric": d.metric,
            "value": d.value if math.isfinite(d.value) else None, "ts_ns": d.ts_ns, "stale": d.stale,
            "decision_id": d.decision_id}


def _name_error(namespace: str, workload: str) -> str | None:
    if len(namespace) > NAMESPACE_MAX or not NAMESPACE_RE.fullmatch(namespace):
        return f"namespace is not a Kubernetes namespace name (lower-case RFC 1123 label, <= {NAMESPACE_MAX})"
    if len(workload) > WORKLOAD_MAX or not WORKLOAD_RE.fullmatch(workload):
        return f"workload is not a Kubernetes object name (lower-case RFC 1123 subdomain, <= {WORKLOAD_MAX})"
    return None


def _json(web: View, value: Any, status: int = 200) -> Response:
    # orjson, not Faust's json(): a stable encoder whatever Faust picks, and NaN never goes out as bare NaN.
    return web.bytes(orjson.dumps(value), status=status, headers={"Content-Type": JSON})


def install_web(app: faust.App, metrics: Metrics, view: ScaleView) -> None:
    """Register ``/metrics``, ``/keda`` and ``/keda/{namespace}/{workload}`` on ``app``'s web server;
    call it while building the app, before the worker starts (routes are fixed once it serves)."""

    @app.page("/metrics", name="flopwatch-metrics")
    async def metrics_page(web: View, request: Request) -> Response:
        body, content_type = metrics.render()
        # In headers, not content_type=: aiohttp refuses a content_type that carries a charset.
        return web.bytes(body, headers={"Content-Type": content_type})

    @app.page("/keda", name="flopwatch-keda-all")
    async def keda_all(web: View, request: Request) -> Response:
        rows = sorted(view.all(), key=lambda d: (d.namespace, d.workload))
        return _json(web, {"workloads": [desired_json(d) for d in rows]})

    @app.page("/keda/{namespace}/{workload}", name="flopwatch-keda")
    async def keda_one(web: View, request: Request, namespace: str, workload: str) -> Response:
        problem = _name_error(namespace, workload)
        if problem is not None:
            return _json(web, {"error": problem}, status=400)
        d = view.get(namespace, workload)
        if d is None:
            return _json(web, {"error": "no decision for this workload on this worker", "namespace": namespace,
                               "workload": workload}, status=404)
        return _json(web, desired_json(d))
