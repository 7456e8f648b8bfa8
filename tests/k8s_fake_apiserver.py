"""A local Kubernetes API server double for the K8s collector: list + watch of pods and
core/v1 Events over plain HTTP on 127.0.0.1, in a thread.

It keeps a store like etcd does: one global resourceVersion counter, every change
recorded with its version. A list returns the live objects at the current version; a
watch from version X streams the changes after X as chunked JSON lines
(``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}``), then waits for new
ones, sending a BOOKMARK at the current version every ``bookmark_s`` when asked for
them. Faults for tests:

- ``compact()``: versions up to now are forgotten; a watch from before them gets an ERROR
  event with code 410 (what a real server does), or an HTTP 410 with ``gone_as_http``;
- ``drop_watch(resource, after=n)``: the watch of that resource (open now or the next one)
  sends n more events and then its connection is cut mid-stream (no final chunk).
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

KINDS = {"pods": "Pod", "events": "Event"}


@dataclass
class _Change:
    rv: int
    resource: str
    type: str
    obj: dict[str, Any]


@dataclass
class FakeCluster:
    """The store and the fault switches; thread-safe."""

    bookmark_s: float = 0.5
    gone_as_http: bool = False
    rv: int = 100
    compacted_rv: int = 0
    live: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {r: {} for r in KINDS})
    changes: list[_Change] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def apply(self, resource: str, type_: str, obj: dict[str, Any]) -> dict[str, Any]:
        """ADDED / MODIFIED / DELETED ``obj`` (keyed by metadata.uid); returns it with its new version."""
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj.setdefault("kind", KINDS[resource])
            obj.setdefault("apiVersion", "v1")
            obj["metadata"]["resourceVersion"] = str(self.rv)
            uid = obj["metadata"]["uid"]
            if type_ == "DELETED":
                self.live[resource].pop(uid, None)
            else:
                self.live[resource][uid] = obj
            self.changes.append(_Change(self.rv, resource, type_, obj))
            self.cond.notify_all()
            return obj

    def compact(self) -> None:
        with self.cond:
            self.compacted_rv = self.rv
            self.changes = [c for c in self.changes if c.rv > self.compacted_rv]

    def drop_watch(self, resource: str, after: int) -> None:
        with self.cond:
            self.drops[resource] = after

    def list(self, resource: str, namespace: str | None) -> dict[str, Any]:
        with self.cond:
            items = [copy.deepcopy(o) for o in self.live[resource].values()
                     if namespace is None or o["metadata"].get("namespace") == namespace]
            return {"kind": KINDS[resource] + "List", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)}, "items": items}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cluster: FakeCluster
    stopping: threading.Event

    def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures anyway
        pass

    def _route(self) -> tuple[str, str | None] | None:
        parts = urlparse(self.path).path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return None
        if len(parts) == 3 and parts[2] in KINDS:
            return parts[2], None
        if len(parts) == 5 and parts[2] == "namespaces" and parts[4] in KINDS:
            return parts[4], parts[3]
        return None

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.cluster.requests.append(self.path)
        route = self._route()
        if route is None:
            self._json(404, {"kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound"})
            return
        resource, namespace = route
        query = {k: v[-1] for k, v in parse_qs(urlparse(self.path).query).items()}
        if query.get("watch") not in ("1", "true", "True"):
            self._json(200, self.cluster.list(resource, namespace))
            return
        self._watch(resource, namespace, int(query.get("resourceVersion") or self.cluster.rv),
                    query.get("allowWatchBookmarks") in ("true", "True", "1"), float(query.get("timeoutSeconds", 60)))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, type_: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

    def _watch(self, resource: str, namespace: str | None, since: int, bookmarks: bool, timeout_s: float) -> None:
        c = self.cluster
        gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": f"too old resource version: {since} ({c.compacted_rv})", "reason": "Expired", "code": 410}
        if since < c.compacted_rv and c.gone_as_http:
            self._json(410, gone)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if since < c.compacted_rv:
            self._event("ERROR", gone)
            self._chunk(b"")
            return
        last, waited = since, 0.0

        def pending() -> list[_Change]:
            return [ch for ch in c.changes if ch.rv > last and ch.resource == resource
                    and (namespace is None or ch.obj["metadata"].get("namespace") == namespace)]

        while waited < timeout_s and not self.stopping.is_set():
            bookmark: int | None = None
            with c.cond:
                todo = pending()
                if not todo:
                    c.cond.wait(c.bookmark_s)
                    waited += c.bookmark_s
                    todo = pending()
                    if not todo and bookmarks:
                        last = max(last, c.rv)  # nothing of ours up to here: a bookmark may say so
                        bookmark = last
            for ch in todo:
                with c.cond:
                    left = c.drops.get(resource)
                    if left is not None:
                        if left <= 0:
                            del c.drops[resource]
                        else:
                            c.drops[resource] = left - 1
                if left is not None and left <= 0:
                    self._cut()
                    return
                self._event(ch.type, ch.obj)
                last = ch.rv
            if bookmark is not None:
                self._event("BOOKMARK", {"kind": KINDS[resource], "apiVersion": "v1",
                                         "metadata": {"resourceVersion": str(bookmark)}})
        self._chunk(b"")

    def _cut(self) -> None:
        """Close the TCP connection in the middle of the chunked body: a dropped connection."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class FakeApiServer:
    """``with FakeApiServer() as api:`` serves ``api.cluster`` at ``api.url`` until the block ends."""

    def __init__(self, cluster: FakeCluster | None = None) -> None:
        self.cluster = cluster or FakeCluster()
        self._stopping = threading.Event()
        handler = type("Handler", (_Handler,), {"cluster": self.cluster, "stopping": self._stopping})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-apiserver", daemon=True)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        with self.cluster.cond:
            self.cluster.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig pointing at this server (token auth, no TLS)."""
        path.write_text(json.dumps({  # JSON is YAML: the client's loader reads it
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "test-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}), encoding="utf-8")
        return path


@contextmanager
def fake_apiserver(**kw: Any) -> Iterator[FakeApiServer]:
    with FakeApiServer(FakeCluster(**kw)) as api:
        yield api
