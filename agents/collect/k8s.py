"""``flopwatch collect k8s``: watch the API server's pods and core/v1 Events and publish
them to ``k8s.events`` (key = node), each exactly once across restarts and ``410 Gone``.

The official ``kubernetes`` client does the HTTP (auth from a kubeconfig or the pod's
service account); ``streams.formats.k8s_watch.WatchState`` decides what to publish and where to
resume. One thread per watched resource; every call into the state and every send holds
one lock, so the state's snapshot always matches what was handed to the producer.

Exactly once, how: every record carries its dedupe id in the ``flopwatch.k8s.id``
header. Each save writes, atomically, the state (resourceVersions, pod cache, seen ids)
and the topic's end offsets read *before* the snapshot was taken, after the producer
flushed. A collector killed between a send and the next save finds, on restart, the ids
it sent after that snapshot by reading the topic from those offsets.

RBAC it needs: API group ``""``, resources ``pods`` and ``events``, verbs ``get``,
``list``, ``watch`` (a Role per namespace with ``--namespace``, else a ClusterRole).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import click
import orjson

from agents.collect.k8s_resume import DEDUPE_HEADER, StateFile, TopicLedger
from agents.kafka.topics import Topics
from agents.runtime.entry import settings_of, setup_logging, stop_on_signal, write_summary
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from schemas.codec import encode_k8s_event
from streams.formats.k8s_objects import WatchParams
from streams.formats.k8s_watch import RESOURCES, Publish, Resource, WatchState

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; we reconnect from the last resourceVersion
LIST_PAGE = 500


def api_client(kubeconfig: str | None) -> Any:
    """An ApiClient: the named kubeconfig; else in-cluster when KUBERNETES_SERVICE_HOST is set;
    else $KUBECONFIG or ~/.kube/config."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # the client's config loaders carry no type hints
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)  # $KUBECONFIG, else ~/.kube/config
    except (config.ConfigException, OSError) as exc:
        raise click.ClickException(f"no usable Kubernetes credentials: {exc}") from None
    return client.ApiClient(cfg)


class K8sCollector:
    """The watch threads, the producer and the periodic save."""

    def __init__(self, settings: Settings, api: Any, namespace: str | None, state_file: StateFile,
                 params: WatchParams | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        from kubernetes import client

        from agents.kafka.producer import SampleProducer

        self.topic = Topics(settings.topic_prefix).k8s_events
        self._clock = clock
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._file = state_file
        self._ledger = TopicLedger(settings, self.topic)
        loaded = state_file.load()
        self.state = WatchState(params or WatchParams(), loaded["watch"] if loaded else None)
        if loaded:
            found = self._ledger.ids_since(loaded.get("kafka_offsets", {}))
            self.state.mark_seen(found)
            log.info("resuming from %s (resourceVersions %s; %d ids sent after its last save)", state_file.path,
                     self.state.rv, len(found))
        self._producer = SampleProducer(settings, **{"linger.ms": 5})
        self._lock = threading.Lock()
        self._dirty = True
        self.stop = threading.Event()
        self._pods_ready = threading.Event()
        self._watches: dict[str, Any] = {}
        self.reconnects = 0
        self.bad_objects = 0
        if not loaded:
            self.save()  # the topic's offsets before our first send: a crash before the next save dedupes too

    # -- API calls -------------------------------------------------------------------------
    def _func(self, resource: Resource) -> tuple[Any, tuple[str, ...]]:
        c = self._core
        if self._namespace:
            return (c.list_namespaced_pod if resource == "pods" else c.list_namespaced_event), (self._namespace,)
        return (c.list_pod_for_all_namespaces if resource == "pods" else c.list_event_for_all_namespaces), ()

    def _list(self, resource: Resource) -> tuple[list[dict[str, Any]], str]:
        func, args = self._func(resource)
        items: list[dict[str, Any]] = []
        token: str | None = None
        rv = ""
        while True:
            kw: dict[str, Any] = {"limit": LIST_PAGE, "_preload_content": False, "_request_timeout": 60}
            if token:
                kw["_continue"] = token
            body = orjson.loads(func(*args, **kw).data)
            meta = body.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion", ""))  # the first page's: the list is one snapshot at it
            items += body.get("items") or []
            token = meta.get("continue")
            if not token:
                return items, rv

    def _watch(self, resource: Resource, rv: str) -> int:
        from kubernetes import watch as kube_watch

        watch: Any = kube_watch  # untyped in the client
        func, args = self._func(resource)
        w = watch.Watch(return_type="object")  # raw dicts: the pure state reads the API's JSON
        self._watches[resource] = w
        n = 0
        try:
            for ev in w.stream(func, *args, resource_version=rv, allow_watch_bookmarks=True,
                               timeout_seconds=WATCH_TIMEOUT_S, _request_timeout=(10, WATCH_TIMEOUT_S + 30)):
                n += 1
                with self._lock:
                    try:
                        step = self.state.on_event(resource, str(ev.get("type")), ev.get("raw_object") or {},
                                                   self._clock.wall_ns())
                    except Exception:  # an object our mapping trips on: skip it, never loop on it
                        self.bad_objects += 1
                        log.exception("%s watch: cannot map %s event; skipped", resource, ev.get("type"))
                        continue
                    self._send(step.publish)
                if step.end_watch or self.stop.is_set():
                    w.stop()
                    break
        finally:
            self._watches.pop(resource, None)
        return n

    def _send(self, pubs: list[Publish]) -> None:
        """Called with the lock held."""
        self._dirty = True
        for p in pubs:
            self._producer.send(self.topic, encode_k8s_event(p.event), p.node, headers=[(DEDUPE_HEADER, p.dedupe)])

    # -- the threads -----------------------------------------------------------------------
    def _run(self, resource: Resource) -> None:
        from kubernetes.client.exceptions import ApiException

        delay = 0.5
        while not self.stop.is_set():
            with self._lock:
                req = self.state.request(resource)
            started = time.monotonic()
            try:
                if req.resource_version is None:
                    items, rv = self._list(resource)
                    with self._lock:
                        self._send(self.state.on_list(resource, items, rv, self._clock.wall_ns()))
                    log.info("listed %d %s at resourceVersion %s", len(items), resource, rv)
                    if resource == "pods":
                        self._pods_ready.set()
                    continue
                if resource == "pods":
                    self._pods_ready.set()  # resuming: the pod cache came with the state
                if self._watch(resource, req.resource_version) or time.monotonic() - started > 1.0:
                    delay = 0.5
                    continue  # the server ended the watch: resume at once
                reason = "watch ended at once"
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s: resourceVersion %s is gone (410): listing again", resource, req.resource_version)
                    with self._lock:
                        self.state.on_gone(resource)
                    continue
                reason = f"HTTP {exc.status} {exc.reason}"
            except Exception as exc:  # a dropped connection, a refused one, a bad body: retry, never die
                reason = f"{type(exc).__name__}: {exc}"
            if self.stop.is_set():
                break
            self.reconnects += 1
            log.warning("%s watch: %s; again in %.1f s from resourceVersion %s", resource, reason, delay,
                        req.resource_version)
            self.stop.wait(delay)
            delay = min(delay * 2, 30.0)

    def save(self) -> None:
        """Offsets first, then the snapshot, then flush, then write (see the module docstring)."""
        offsets = self._ledger.end_offsets()
        with self._lock:
            self.state.expire(self._clock.wall_ns())
            snap, self._dirty = self.state.snapshot(), False
        self._producer.flush()
        self._file.save({"watch": snap, "kafka_offsets": offsets})

    def run(self, duration_s: float | None, exit_after: int | None, save_interval_s: float = 1.0) -> None:
        deadline = None if duration_s is None else time.monotonic() + duration_s
        threads = {r: threading.Thread(target=self._run, args=(r,), name=f"watch-{r}", daemon=True) for r in RESOURCES}
        threads["pods"].start()
        # Events about pods need the pods' nodes: start them once the pod cache is filled.
        while not self._pods_ready.wait(0.2) and not self.stop.is_set():
            pass
        threads["events"].start()
        try:
            while not self.stop.is_set():
                self.stop.wait(save_interval_s)
                if deadline is not None and time.monotonic() >= deadline:
                    self.stop.set()
                if exit_after is not None and self.state.stats.published >= exit_after:
                    self.stop.set()
                if self._dirty:
                    self.save()
                self._producer.poll()
        finally:
            self.stop.set()
            for w in list(self._watches.values()):
                w.stop()
            for t in threads.values():
                if t.is_alive():
                    t.join(5.0)
            self.save()
            self._producer.close()
            self._ledger.close()

    def summary(self) -> dict[str, Any]:
        s = self.state.stats
        return {"event": "k8s_collector_stopped", "published": s.published, "duplicates": s.duplicates,
                "no_node": s.no_node, "relists": s.relists, "reconnects": self.reconnects,
                "bad_objects": self.bad_objects, "by_reason": s.counts,
                "resource_versions": self.state.rv}


@click.command("k8s")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="kubeconfig file [default: the pod's service account when KUBERNETES_SERVICE_HOST is set, "
                   "else $KUBECONFIG or ~/.kube/config].")
@click.option("--namespace", default=None, help="Watch one namespace [default: all].")
@click.option("--state", "state_path", type=click.Path(dir_okay=False), default=".flopwatch/k8s-collector.json",
              show_default=True, help="Where the resourceVersions and sent ids are kept (written atomically).")
@click.option("--duration", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Stop after SECONDS (tests) [default: until SIGTERM/SIGINT].")
@click.option("--exit-after", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop once N records were published (tests).")
@click.pass_context
def k8s_command(ctx: click.Context, kubeconfig: str | None, namespace: str | None, state_path: str,
                duration: float | None, exit_after: int | None) -> None:
    """Publish the cluster's Events and pod labels (workload, class, node, GPUs) to k8s.events."""
    settings = settings_of(ctx)
    from agents.kafka.admin import ensure_topics

    api = api_client(kubeconfig)  # no credentials: say so before touching Kafka
    ensure_topics(settings)
    collector = K8sCollector(settings, api, namespace, StateFile(Path(state_path)))
    stop_on_signal(collector.stop)
    log.info("collecting %s of %s into %s", "pods and events", f"namespace {namespace}" if namespace else
             "all namespaces", collector.topic)
    collector.run(duration, exit_after)
    write_summary(collector.summary())


if __name__ == "__main__":  # the lead hangs k8s_command under `flopwatch collect`; tests run the module
    setup_logging()
    k8s_command()
