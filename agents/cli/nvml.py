"""``flopwatch collect nvml``: the command around ``agents.collect.nvml.NvmlCollector``."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading

import click

from agents.collect.nvml import NoDriver, NvmlCollector
from agents.runtime.entry import settings_of, stop_on_signal

log = logging.getLogger("agents.collect.nvml")


def _default_node() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


@click.command("nvml")
@click.option("--interval-ms", type=click.IntRange(min=10), default=100, show_default=True,
              help="Sampling interval of every GPU.")
@click.option("--node", default=None, help="Node name (the Kafka key). Default: $NODE_NAME, else the hostname.")
@click.option("--region", default=None, help="Region label of every GPU. Default: $FLOPWATCH_REGION or $REGION.")
@click.option("--duration", type=float, default=None, metavar="SECONDS", help="Stop after SECONDS (tests, benchmarks).")
@click.option("--proc-root", type=click.Path(file_okay=False), default="/proc", show_default=True, envvar="HOST_PROC",
              help="Where /proc/<pid>/cgroup is read for per-process attribution (the host's /proc: run with hostPID).")
@click.option("--processes/--no-processes", default=True, show_default=True,
              help="Publish each compute process's GPU memory (fb_used of <gpu>/pid:<pid>, labels pid and pod).")
@click.option("--linger-ms", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Longest a sample waits in its series' batch; every batch also goes out right before each "
                   "clock beacon (once a second), when its samples become placeable.")
@click.option("--max-buffered", type=click.IntRange(min=1), default=200_000, show_default=True,
              help="Samples kept while Kafka is unreachable; beyond that new ones are dropped and counted.")
@click.pass_context
def nvml_command(ctx: click.Context, interval_ms: int, node: str | None, region: str | None, duration: float | None,
                 proc_root: str, processes: bool, linger_ms: int, max_buffered: int) -> None:
    """Sample every GPU of this node through NVML and publish to the sensor topics (clock nvml:<node>)."""

    from agents.collect.sdk import Publisher

    try:
        import pynvml
    except ImportError:
        click.echo("flopwatch collect nvml: the nvidia-ml-py package (pynvml) is not installed", err=True)
        sys.exit(2)
    settings = settings_of(ctx)
    node = node or _default_node()
    region = region if region is not None else os.environ.get("FLOPWATCH_REGION") or os.environ.get("REGION", "")
    pub = Publisher(settings, max_age_ms=linger_ms, max_buffered=max_buffered)
    collector = NvmlCollector(pynvml, pub, node, region, proc_root, processes=processes,
                              pcie_fallback_ticks=max(1, round(1000 / interval_ms)))
    try:
        ids = collector.open()
    except NoDriver as exc:
        pub.close(1.0)
        click.echo(f"flopwatch collect nvml: {exc}", err=True)
        sys.exit(2)
    if not ids:
        collector.close()
        pub.close(1.0)
        click.echo("flopwatch collect nvml: NVML found no GPU to sample on this node", err=True)
        sys.exit(2)
    log.info("sampling %d GPUs of %s every %d ms (clock %s): %s", len(ids), node, interval_ms, collector.clock,
             ", ".join(ids))
    stop = threading.Event()
    stop_on_signal(stop)
    reported = [0]

    def report() -> None:
        st = pub.stats
        if st.dropped + st.failed > reported[0]:
            log.warning("Kafka: %d samples dropped (buffer full), %d failed delivery so far; %d buffered",
                        st.dropped, st.failed, pub.buffered)
            reported[0] = st.dropped + st.failed

    try:
        collector.run(interval_ms / 1000.0, duration, stop, report=report)
    finally:
        collector.close()
        st = pub.close(10.0)
    cs = collector.stats
    click.echo(f"collected {cs.samples} samples in {cs.ticks} ticks from {len(ids)} GPUs ({cs.gpus_lost} lost); "
               f"delivered {st.delivered}, dropped {st.dropped}, failed {st.failed}, beacons {st.beacons}", err=True)
    if not collector.gpus:
        sys.exit(1)  # every GPU was lost: a supervisor should restart the collector (or the node)
