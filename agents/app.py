"""The Faust app: ``create_app(settings)`` builds it; the ingest runs inside it as a service.

The app declares every topic of the wire contract with raw-bytes codecs (Faust's own
decode path acks a message and then crashes the agent on bad input, faust#175), so
agents added later decode with ``schemas.codec`` and dead-letter what fails. The
ingest itself is a batch consumer (see ``agents.ingest.worker``) hosted as a Faust service,
so one ``flopwatch worker --runtime faust`` process runs Faust's worker machinery
(signals, logging, service tree) around it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
from mode import Service

from agents.decide.agent import DecideRuntime, DecisionSink, KafkaTriggerSink, decision_columns, trigger_id_of
from agents.decide.agent import install as install_decide
from agents.decide.scale_view import ScaleView
from agents.detect.agent import (
    AlertSink,
    DetectRuntime,
    KafkaAlertSink,
    KafkaSummarySink,
    detection_columns,
    install,
)
from agents.detect.events import K8sEventFeed
from agents.ingest.pricebook_file import PriceBookFile
from agents.ingest.worker import Ingestor, IngestStats
from agents.kafka.faust_producer import App
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics
from agents.livepage.routes import install_page
from agents.livepage.state import LiveDecisions, LiveState
from agents.metrics import AlertDelays, Metrics
from agents.runtime.give_way import AgentQueues
from agents.runtime.history import KafkaFrameHistory
from agents.runtime.timebase import SYSTEM_CLOCK
from agents.settings import Settings
from agents.sinks.clickhouse_rows import ClickHouseRows
from agents.sinks.deadletter import DeadLetter
from agents.web import WebOptions, install_web
from streams.decide.engine import DecisionTally
from streams.decide.rules import Decision


def broker_credentials(settings: Settings) -> Any:
    proto = settings.kafka_security_protocol
    ctx = None
    if proto.endswith("SSL"):
        ctx = ssl.create_default_context(cafile=settings.kafka_ssl_cafile or None)
        if settings.kafka_ssl_certfile:
            ctx.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile or None)
    if proto.startswith("SASL"):
        return faust.SASLCredentials(username=settings.kafka_sasl_username,
                                     password=settings.kafka_sasl_password.get(),
                                     mechanism=settings.kafka_sasl_mechanism, ssl_context=ctx)
    return faust.SSLCredentials(ctx) if ctx is not None else None


class IngestService(Service):
    """Runs an ``Ingestor`` for as long as the Faust worker runs."""

    def __init__(self, ingestor: Ingestor, on_flush: Callable[[IngestStats], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ingestor = ingestor
        self.on_flush = on_flush
        self._stop = asyncio.Event()
        self._task: asyncio.Task[IngestStats] | None = None
        self._crashing: asyncio.Future[None] | None = None

    async def on_start(self) -> None:
        self._task = asyncio.ensure_future(self.ingestor.run(self._stop, self.on_flush))
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[IngestStats]) -> None:
        # An ingest that died (Kafka or ClickHouse gone for good) must take the worker with it,
        # so that whatever supervises the process restarts it; the agents alone would look healthy.
        if not task.cancelled() and task.exception() is not None and not self._stop.is_set():
            self._crashing = asyncio.ensure_future(self.crash(task.exception()))  # type: ignore[arg-type]

    async def on_stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def create_app(settings: Settings, on_flush: Callable[[IngestStats], None] | None = None,
               detect: bool = True) -> faust.App:
    """A Faust app wired to the configured broker, with every flopwatch topic declared as raw bytes:
    the ingest as a service and (``detect``) the detection agent on ``flopwatch.frames``."""
    brokers = ";".join(f"kafka://{b.strip()}" for b in settings.kafka_bootstrap.split(","))
    faust_dir = Path(settings.chdb_path).parent / "faust"
    faust_dir.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level of its data directory
    app = App(
        f"{settings.group_id}-app",
        broker=brokers,
        broker_credentials=broker_credentials(settings),
        value_serializer="raw",
        key_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.kafka_session_timeout_s,
        store="memory://",
        # Beside chDB's directory (.flopwatch/ by default), not Faust's "<id>-data" in whatever directory the
        # worker was started from: the tables are in memory, but Faust still makes the directory.
        datadir=str(faust_dir / "{conf.id}"),
        autodiscover=False,
        **WebOptions.from_settings(settings).app_kwargs(),
    )
    names = Topics(settings.topic_prefix)
    app.flopwatch_topics = {  # type: ignore[attr-defined]
        name: app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                        partitions=settings.partitions, internal=False)
        for name in names.all
    }
    agent_queues = AgentQueues()  # the agents' inputs, which the ingest gives way to
    ingestor = Ingestor(settings, agents=agent_queues)
    app.flopwatch_ingestor = ingestor  # type: ignore[attr-defined]
    metrics = Metrics()
    app.flopwatch_metrics = metrics  # type: ignore[attr-defined]
    runtime = detect_runtime(settings, app, ingestor, metrics) if detect else None
    app.flopwatch_detect = runtime  # type: ignore[attr-defined]
    view = ScaleView()
    app.flopwatch_scale_view = view  # type: ignore[attr-defined]
    deciding = decide_runtime(settings, app, ingestor, view, metrics) if detect and settings.decide else None
    app.flopwatch_decide = deciding  # type: ignore[attr-defined]
    live = LiveState() if settings.web_enabled else None  # the /live page's view of this worker
    app.flopwatch_live = live  # type: ignore[attr-defined]
    if live is not None:
        if runtime is not None:
            runtime.on_frame = live.on_frame
            runtime.sinks.append(live)
        if deciding is not None:
            deciding.sinks.append(LiveDecisions(live))

    def flushed(st: IngestStats) -> None:
        metrics.observe_ingest(st)
        if live is not None:
            live.on_flush(st.samples, st.lag, st.frames_written, sum(st.rejects.values()), time.monotonic())
        if runtime is not None:  # one progress line for the whole worker
            d = runtime.stats
            metrics.observe_detect(d)
            st.detect = {"frames": d.frames, "alerts": d.alerts.total, "firing": d.firing, "rebuilds": d.rebuilds,
                         "replayed": d.replayed, "rejects": d.rejects, "errors": d.errors}
        if deciding is not None:
            c = deciding.stats
            st.detect = {**st.detect, "summaries": c.samples, "triggers": c.decisions.total("taken"),
                         "withheld": c.decisions.total("withheld"),
                         "decide_rebuilds": c.rebuilds, "decide_errors": c.errors}
        if on_flush is not None:
            on_flush(st)

    class _BoundIngest(IngestService):  # Faust instantiates service classes itself
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(ingestor, flushed, **kwargs)

    app.service(_BoundIngest)
    if runtime is not None:
        install(app, runtime, app.flopwatch_topics[names.frames], agent_queues)  # type: ignore[attr-defined]
        if runtime.params.attribution.enabled:
            book = runtime.events

            class _BoundEvents(K8sEventFeed):
                def __init__(self, **kwargs: Any) -> None:
                    super().__init__(settings, names.k8s_events, book, **kwargs)

            app.service(_BoundEvents)
    if deciding is not None:
        install_decide(app, deciding, app.flopwatch_topics[names.workloads], agent_queues)  # type: ignore[attr-defined]
    if live is not None:  # the web server is on
        install_web(app, metrics, view)  # routes are fixed once the server runs
        install_page(app, live, ingestor.on_clickhouse, settings.grid_ms)
    return app


def detect_runtime(settings: Settings, app: faust.App, ingestor: Ingestor, metrics: Metrics) -> DetectRuntime:
    """The detection agent's state and outputs: alerts to Kafka and to ClickHouse, rejects to the DLQ."""
    names = Topics(settings.topic_prefix)
    alerts_topic = app.flopwatch_topics[names.alerts]  # type: ignore[attr-defined]
    sinks: list[AlertSink] = [KafkaAlertSink(alerts_topic),
                              ClickHouseRows("detections", detection_columns, ingestor.on_clickhouse),
                              AlertDelays(metrics)]
    summaries = KafkaSummarySink(app.flopwatch_topics[names.workloads]) if settings.decide else None  # type: ignore[attr-defined]
    params = settings.detect_params()
    # The leak rules' windows are longer than the drift rule's: the rebuild replays enough for both.
    return DetectRuntime(params, settings.align_params().grid_ns,
                         KafkaFrameHistory(settings, names.frames, names.alerts), sinks,
                         DeadLetter(SampleProducer(settings), names.dlq), names.frames,
                         replay_s=max(settings.detect_replay_s, params.leaks.history_s()), summaries=summaries,
                         link_bytes_s=link_capacity(settings))


def link_capacity(settings: Settings) -> Callable[[str], float | None]:
    """PCIe link capacity per direction (B/s) of a GPU model, from the price book's specs."""
    book = PriceBookFile(Path(settings.price_book) if settings.price_book else None, SYSTEM_CLOCK)

    def bytes_s(model: str) -> float | None:
        spec = book.current().spec(model) if model else None
        return spec.pcie_gb_s * 1e9 if spec is not None else None

    return bytes_s


def decide_runtime(settings: Settings, app: faust.App, ingestor: Ingestor, view: ScaleView,
                   metrics: Metrics) -> DecideRuntime:
    """The decision agent's state and outputs: triggers to Kafka, every decision to ClickHouse."""
    names = Topics(settings.topic_prefix)
    triggers_topic = app.flopwatch_topics[names.triggers]  # type: ignore[attr-defined]
    sinks: list[DecisionSink] = [KafkaTriggerSink(triggers_topic),
                                 ClickHouseRows("scale_decisions", decision_columns, ingestor.on_clickhouse)]
    history = KafkaFrameHistory(settings, names.workloads, names.triggers, id_of=trigger_id_of)

    def observed(d: Decision) -> None:  # per decision, so /metrics follows at once and not on the next flush
        observe_decision(metrics, runtime.stats.decisions, d)

    runtime = DecideRuntime(settings.decide_params(), history, sinks, DeadLetter(SampleProducer(settings), names.dlq),
                            names.workloads, view=view, replay_s=settings.decide_replay_s, on_decision=observed)
    return runtime


def observe_decision(metrics: Metrics, tally: DecisionTally, d: Decision) -> None:
    metrics.observe_decisions(tally)
    if d.outcome == "taken":  # wall clock from the end of the deciding tick to the trigger's send
        metrics.observe_delay("trigger", max(0.0, (time.time_ns() - d.trigger.ts_ns) / 1e9))
