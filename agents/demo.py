"""``flopwatch demo``: local Kafka, embedded ClickHouse, a simulated cluster and a live progress view."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from agents.admin import ensure_topics
from agents.clickhouse import open_backend
from agents.ingest import Ingestor, IngestStats
from agents.settings import Settings
from agents.simulator import PublishStats, SimulatorPublisher
from streams.simulate import SimParams

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
                      ("k8s events written", st.events_written), ("rejects -> flopwatch.dlq", rejects),
                      ("consumer lag", "?" if st.lag is None else st.lag), ("open grid cells", st.open_cells)]:
        t.add_row(name, str(val))
    return t


def _summary(settings: Settings) -> Table:
    backend = open_backend(settings)
    db = backend.database
    try:
        names, rows = backend.rows(
            f"SELECT node, gpu, any(workload_class) AS class, count() AS frames, round(avg(power), 1) AS power_w, "
            f"round(avg(tensor_active), 3) AS tensor, max(temperature) AS max_temp_c, min(sm_clock) AS min_clock, "
            f"sum(n_gpu_util + n_power + n_temperature) AS nvml_samples FROM {db}.gpu_frames "
            f"WHERE ts > now64(3) - INTERVAL 1 HOUR GROUP BY node, gpu ORDER BY node, gpu")
    finally:
        backend.close()
    table = Table(*names, title="gpu_frames, last hour (flopwatch sql \"...\" for more)")
    for r in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in r))
    return table


def run_demo(settings: Settings, duration: float, nodes: int, gpus: int, root: Path) -> None:
    started_kafka = False
    if not os.environ.get("FLOPWATCH_KAFKA_BOOTSTRAP"):
        started_kafka = _start_local_kafka(root)
    # The simulator publishes every topic promptly, so the live view can write a stopped run's
    # last cells after a short quiet time instead of the default bound meant for real collectors.
    settings = settings.replace(source_idle_s=min(settings.source_idle_s, 3.0))
    try:
        ensure_topics(settings)
        params = SimParams(nodes=nodes, gpus=gpus, seed=int(time.time()) % 1000, start_ns=time.time_ns())
        pub = SimulatorPublisher(settings, params, batch_size=100, bad_every=500)
        stop_pub = threading.Event()
        producer = threading.Thread(target=pub.live, args=(duration, stop_pub), daemon=True)
        ingestor = Ingestor(settings)
        asyncio.run(_run(ingestor, pub, producer, stop_pub, duration))
        producer.join(10)
        pub.producer.close()
        console.print(_progress(pub.stats, ingestor.stats, duration, duration))
        console.print(_summary(settings))
        console.print(f"data: {Path(settings.chdb_path).resolve()}\ntry: flopwatch sql \"SELECT ts, node, gpu, "
                      "power, tensor_active FROM flopwatch.gpu_frames ORDER BY ts DESC LIMIT 5\"")
    finally:
        if started_kafka:
            subprocess.run([str(root / "deploy" / "kafka.sh"), "stop"], check=False, stdout=subprocess.DEVNULL)


async def _run(ingestor: Ingestor, pub: SimulatorPublisher, producer: threading.Thread, stop_pub: threading.Event,
               duration: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(ingestor.run(stop))
    t0 = time.monotonic()
    producer.start()
    try:
        with Live(_progress(pub.stats, ingestor.stats, 0, duration), console=console, refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(0.25)
                if task.done():
                    break
                st = ingestor.stats
                live.update(Group(_progress(pub.stats, st, time.monotonic() - t0, duration)))
                drained = st.samples >= pub.stats.samples and st.lag == 0 and st.open_cells == 0
                if not producer.is_alive() and drained:
                    break
    finally:
        stop_pub.set()
        stop.set()
        await task
