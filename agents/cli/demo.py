"""``flopwatch demo``: local Kafka, embedded ClickHouse, a simulated cluster with scheduled events, and a live
view of efficiency, cost and alerts from the Faust worker running in this process."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import faust
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from agents.app import create_app
from agents.collect.scenario_file import load_scenario
from agents.collect.simulator import PublishStats, SimulatorPublisher
from agents.ingest.worker import Ingestor, IngestStats
from agents.kafka.admin import ensure_topics
from agents.livepage.routes import page_url
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from schemas.alerts import Alert
from schemas.frame_messages import FrameMessage, GpuFrame
from streams.decide.rules import Decision
from streams.sim.simulate import SimParams

# Piped output (CI logs, `| tee`) gets a width that fits the summary instead of rich's 80.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def _start_local_kafka(root: Path) -> bool:
    """Start the bundled KRaft broker unless one runs; True if this call started it."""
    script = root / "deploy" / "kafka.sh"
    if not script.exists():
        raise SystemExit("no local Kafka script found (deploy/kafka.sh); set FLOPWATCH_KAFKA_BOOTSTRAP to a broker")
    running = subprocess.run([str(script), "status"], capture_output=True).returncode == 0
    if not running:
        console.print("[bold]starting a local Kafka broker (KRaft)...[/bold] first run resolves its jars with Maven")
        subprocess.run([str(script), "start"], check=True, stdout=subprocess.DEVNULL)
    return not running


def _progress(pub: PublishStats, st: IngestStats, elapsed: float, duration: float) -> Table:
    t = Table(title=f"flopwatch demo  {min(elapsed, duration):5.1f} / {duration:.0f} s", show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    rate = st.samples / elapsed if elapsed > 0 else 0.0
    rejects = ", ".join(f"{k}={v}" for k, v in sorted(st.rejects.items())) or "0"
    for name, val in [("messages published", pub.messages), ("samples published", pub.samples),
                      ("samples in", f"{st.samples}  ({rate:,.0f}/s)"), ("frames written", st.frames_written),
                      ("frames published", st.frames_published),
                      ("k8s events written", st.events_written), ("rejects -> flopwatch.dlq", rejects),
                      ("consumer lag", "?" if st.lag is None else st.lag), ("open grid cells", st.open_cells)]:
        t.add_row(name, str(val))
    return t


class LiveView:
    """What the detection agent sees: each GPU's latest efficiency and cost, and the latest alerts."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], tuple[int, int, GpuFrame]] = {}
        self.alerts: deque[Alert] = deque(maxlen=10)
        self.decisions: deque[Decision] = deque(maxlen=8)

    def on_frame(self, m: FrameMessage) -> None:
        for g in m.gpus:
            if g.gpu != "host":
                self.latest[(m.node, g.gpu)] = (m.tick_ns, m.grid_ns, g)

    async def send(self, alerts: Sequence[Alert]) -> None:  # an AlertSink beside Kafka and ClickHouse
        self.alerts.extend(alerts)

    def gpus(self, t0_ns: int) -> Table:
        t = Table("node", "gpu", "workload", "t s", "TFLOP/s", "GFLOPS/W", "$/TFLOP/s-h", "$/h", "idle",
                  title="per GPU, latest frame (flopwatch.frames)")
        for (node, gpu), (tick, grid_ns, g) in sorted(self.latest.items()):
            d = g.derived
            cost_h = None if d["cost_usd"] is None else d["cost_usd"] * 3600e9 / grid_ns
            t.add_row(node, gpu, str(g.labels.get("workload", "")), f"{(tick - t0_ns) / 1e9:5.0f}",
                      _fmt(d["tflops"], "{:.0f}"), _fmt(d["flops_per_watt"], "{:.0f}", 1e-9),
                      _fmt(d["cost_per_tflops"], "{:.4f}"), _fmt(cost_h, "{:.2f}"),
                      "yes" if d["idle"] == 1.0 else ("" if d["idle"] is not None else "?"))
        return t

    def decision_table(self, t0_ns: int) -> Table:
        t = Table("t s", "outcome", "action", "workload", "replicas", "reasons", "held by",
                  title="scale decisions (flopwatch.triggers, ClickHouse scale_decisions)")
        for d in self.decisions:
            tr = d.trigger
            style = "bold" if d.outcome == "taken" else "dim"
            t.add_row(f"{(tr.ts_ns - t0_ns) / 1e9:5.0f}", f"[{style}]{d.outcome}[/{style}]", tr.action,
                      f"{tr.namespace}/{tr.workload}", f"{tr.current} -> {tr.desired}", ",".join(tr.reasons),
                      d.gate or "")
        if not self.decisions:
            t.add_row("", "", "none yet", "", "", "", "")
        return t

    def alert_table(self, t0_ns: int) -> Table:
        t = Table("t s", "state", "rule", "node/gpu", "value", "threshold", "baseline", "USD/h", "likely cause",
                  title="alerts (flopwatch.alerts, ClickHouse detections); a leak's USD/h is what it burns")
        for a in self.alerts:
            style = "red" if a.state == "firing" else "green"
            usd = a.evidence.get("cost_usd_per_h")
            cause = f"{a.causes[0].cause} ({a.causes[0].confidence:.2f})" if a.causes else ""
            t.add_row(f"{(a.ts_ns - t0_ns) / 1e9:5.0f}", f"[{style}]{a.state}[/{style}]", a.rule, f"{a.node}/{a.gpu}",
                      _fmt(a.value, "{:.4g}"), _fmt(a.threshold, "{:.4g}"), _fmt(a.baseline, "{:.4g}"),
                      f"{usd:.2f}" if isinstance(usd, int | float) else "", cause)
        if not self.alerts:
            t.add_row("", "", "none yet", "", "", "", "", "", "")
        return t


class DecisionFeed:
    """A decision sink beside Kafka and ClickHouse, for the live view."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    async def send(self, decisions: Sequence[Decision]) -> None:
        self.view.decisions.extend(decisions)


def _fmt(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "NULL" if v is None else spec.format(v * scale)


def _summary(settings: Settings) -> Table:
    backend = open_backend(settings)
    db = backend.database
    try:
        names, rows = backend.rows(
            f"SELECT node, gpu, any(workload_class) AS class, count() AS frames, round(avg(power), 1) AS power_w, "
            f"round(avg(tflops), 1) AS avg_tflops, round(avg(flops_per_watt) / 1e9, 1) AS gflops_per_w, "
            f"round(sum(cost_usd), 4) AS usd, round(sumIf(cost_usd, idle = 1), 4) AS idle_usd, "
            f"max(temperature) AS max_temp_c FROM {db}.gpu_frames "
            f"WHERE ts > now64(3) - INTERVAL 1 HOUR AND gpu != 'host' GROUP BY node, gpu ORDER BY node, gpu")
        _, det = backend.rows(f"SELECT rule, state, count() FROM {db}.detections FINAL GROUP BY rule, state "
                              "ORDER BY rule, state")
    finally:
        backend.close()
    table = Table(*names, title="gpu_frames, last hour (flopwatch sql \"...\" for more); detections: "
                  + (", ".join(f"{r} {s} x{n}" for r, s, n in det) or "none"))
    for r in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in r))
    return table


def _leak_summary(settings: Settings) -> str:
    """The leak ledger of the run, as `flopwatch leaks` prints it."""
    from agents.cli.leaks import ledger_query, render

    backend = open_backend(settings)
    try:
        sql, params = ledger_query(backend.database, backend.layout, 3600.0, None, 20,
                                   native=settings.clickhouse_backend != "chdb")
        names, rows = backend.rows(sql, params)
    finally:
        backend.close()
    return render([dict(zip(names, r, strict=True)) for r in rows], "the run (flopwatch leaks)").rstrip()


def run_demo(settings: Settings, duration: float, nodes: int, gpus: int, root: Path) -> None:
    # A scenario that does not fit the cluster fails before a broker is started for nothing.
    scenario = load_scenario(root / "deploy" / "scenarios" / "live-demo.toml")
    scenario.check_cluster(nodes, gpus)
    started_kafka = False
    if not os.environ.get("FLOPWATCH_KAFKA_BOOTSTRAP"):
        started_kafka = _start_local_kafka(root)
    # The simulator publishes every topic promptly, so the live view can write a stopped run's
    # last cells after a short quiet time instead of the default bound meant for real collectors.
    settings = settings.replace(source_idle_s=min(settings.source_idle_s, 3.0))
    for name in ("faust", "mode", "aiokafka"):  # their INFO lines would scroll the live view away
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        ensure_topics(settings)
        # Steady GPUs: what changes their efficiency is the scenario's events, so the alerts mean something.
        params = SimParams(nodes=nodes, gpus=gpus, seed=int(time.time()) % 1000, start_ns=time.time_ns(),
                           steady=True)
        pub = SimulatorPublisher(settings, params, batch_size=100, bad_every=500, scenario=scenario)
        stop_pub = threading.Event()
        producer = threading.Thread(target=pub.live, args=(duration, stop_pub), daemon=True)
        app = create_app(settings)
        ingestor: Ingestor = app.flopwatch_ingestor  # type: ignore[attr-defined]
        view = LiveView()
        runtime = app.flopwatch_detect  # type: ignore[attr-defined]
        page_frame = runtime.on_frame  # the /live page's, when the web server is on

        def on_frame(m: FrameMessage) -> None:
            view.on_frame(m)
            if page_frame is not None:
                page_frame(m)

        runtime.on_frame = on_frame
        url = page_url(settings.web_bind, settings.web_port) if settings.web_enabled else None
        if url is not None:
            console.print(f"[bold]live page:[/bold] {url}  (open it in a browser; it updates every second)")
        runtime.sinks.append(view)
        deciding = app.flopwatch_decide  # type: ignore[attr-defined]
        if deciding is not None:
            deciding.sinks.append(DecisionFeed(view))
        try:
            asyncio.run(_run(app, ingestor, view, pub, producer, stop_pub, duration, params.start_ns, url))
            producer.join(10)
        finally:
            # Every Kafka client closes before the broker stops: one left open logs "Connection refused"
            # once a second after the summary.
            pub.producer.close()
            for agent in (runtime, deciding):
                if agent is not None:
                    agent.close()
        console.print(_progress(pub.stats, ingestor.stats, duration, duration))
        console.print(view.alert_table(params.start_ns))
        console.print(view.decision_table(params.start_ns))
        console.print(_summary(settings))
        console.print(_leak_summary(settings))
        console.print(f"data: {Path(settings.chdb_path).resolve()}\ntry: flopwatch sql \"SELECT namespace, workload, "
                      "gpu_hours, usd, usd_per_tflops_h, flops_per_watt FROM cost_by_workload\" (more views and "
                      "queries: docs/sql.md)")
    finally:
        if started_kafka:
            subprocess.run([str(root / "deploy" / "kafka.sh"), "stop"], check=False, stdout=subprocess.DEVNULL)


async def _run(app: faust.App, ingestor: Ingestor, view: LiveView, pub: SimulatorPublisher,
               producer: threading.Thread, stop_pub: threading.Event, duration: float, t0_ns: int,
               url: str | None) -> None:
    await app.start()  # the Faust app in this process: the ingest service and the detection agent
    t0 = time.monotonic()
    producer.start()
    try:
        with Live(_progress(pub.stats, ingestor.stats, 0, duration), console=console, refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(0.25)
                st = ingestor.stats
                live.update(Group(f"live page: {url}" if url else "", _progress(pub.stats, st, time.monotonic() - t0,
                                  duration), view.gpus(t0_ns), view.alert_table(t0_ns), view.decision_table(t0_ns)))
                drained = st.samples >= pub.stats.samples and st.lag == 0 and st.open_cells == 0
                if not producer.is_alive() and drained:
                    await asyncio.sleep(2.0)  # the agent reads the last frames
                    break
    finally:
        stop_pub.set()
        await app.stop()
