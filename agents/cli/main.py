"""The ``flopwatch`` command line: the group, worker, simulate and demo (act, alerts and sql are hung on it from
their own modules)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from agents.cli.lazy import LazyGroup
from agents.runtime.entry import load_or_usage, run_until_signal, setup_logging, write_summary
from agents.settings import Settings, SettingsError

log = logging.getLogger("flopwatch")


def _settings(ctx: click.Context) -> Settings:
    obj: Settings = ctx.obj
    return obj


def _check_policy(settings: Settings) -> None:
    """A decision or leak policy file that cannot be used stops the command before anything starts."""
    try:
        if settings.decide:
            settings.decide_params()
        settings.leak_params()
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(cls=LazyGroup, lazy_commands={"replay": "agents.collect.replay:replay_command",
                                           "collect": "agents.cli.integrations:collect",
                                           "schema": "agents.cli.integrations:schema"})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file (default: $FLOPWATCH_CONFIG). Environment variables override it.")
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
@click.pass_context
def cli(ctx: click.Context, config_file: str | None, verbose: bool) -> None:
    """flopwatch: what your GPU cluster's compute really costs, streamed from Kafka into ClickHouse."""
    setup_logging(verbose)
    ctx.obj = load_or_usage(config_file)


@cli.command()
@click.option("--progress", type=click.Choice(["text", "json", "none"]), default="text",
              help="What to print after each ClickHouse flush (stderr).")
@click.option("--exit-when-idle", type=float, default=None, metavar="SECONDS",
              help="Exit once all input is consumed and written and nothing new came for SECONDS.")
@click.option("--runtime", type=click.Choice(["plain", "faust"]), default=None,
              help="faust (default): one Faust worker runs the ingest (a service) and the detection agent; "
                   "plain: the ingest alone in an asyncio process (it still publishes flopwatch.frames; "
                   "the default with --exit-when-idle).")
@click.pass_context
def worker(ctx: click.Context, progress: str, exit_when_idle: float | None, runtime: str | None) -> None:
    """Consume the sensor topics, align them, write frames to ClickHouse and flopwatch.frames, and run the
    detectors on them (alerts to flopwatch.alerts and ClickHouse detections) until stopped."""
    runtime = runtime or ("plain" if exit_when_idle is not None else "faust")
    from aiokafka.errors import KafkaError

    from agents.ingest.worker import CommitError, Ingestor, IngestStats
    from agents.kafka.admin import KafkaUnavailable, TopicLayoutError, ensure_topics
    from agents.runtime.gc_tuning import tune_for_throughput

    settings = _settings(ctx)
    _check_policy(settings)
    try:
        ensure_topics(settings)
    except (KafkaUnavailable, TopicLayoutError) as exc:
        raise click.ClickException(str(exc)) from None
    ctx.call_on_close(tune_for_throughput())  # put back when the command returns: tests run it in process

    def report(st: IngestStats) -> None:
        if progress == "json":
            write_summary({"event": "flush", **st.as_dict()})
        elif progress == "text":
            log.info("samples=%d frames=%d rejects=%d lag=%s open_cells=%d", st.samples, st.frames_written,
                     sum(st.rejects.values()), st.lag, st.open_cells)
        sys.stderr.flush()

    if runtime == "faust":
        if exit_when_idle is not None:
            raise click.UsageError("--exit-when-idle needs --runtime plain")
        import faust

        from agents.app import create_app
        from agents.livepage.routes import page_url

        if settings.web_enabled:
            log.info("live page: %s  (metrics: /metrics, KEDA: /keda)", page_url(settings.web_bind, settings.web_port))
        faust.Worker(create_app(settings, report), loglevel="INFO").execute_from_commandline()
        return
    ingestor = Ingestor(settings)

    def on_signal(loop: asyncio.AbstractEventLoop) -> None:
        # Commits follow durable writes, so a hard exit after the grace period loses nothing.
        loop.call_later(SHUTDOWN_GRACE_S, _hard_exit)

    async def main(stop: asyncio.Event) -> IngestStats:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        watcher = None
        if exit_when_idle is not None:
            watcher = loop.create_task(_stop_when_idle(ingestor, stop, exit_when_idle))
        try:
            return await ingestor.run(stop, report)
        finally:
            if watcher is not None:
                watcher.cancel()

    try:
        st = run_until_signal(main, on_signal)
    except (CommitError, KafkaError) as exc:
        raise click.ClickException(f"worker stopped: {exc}") from None
    report(st)


SHUTDOWN_GRACE_S = 60.0
# The checkout the demo runs from: its deploy/ scripts start the local broker and hold the scenario.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _dump_tasks() -> None:
    """SIGUSR1: where every coroutine of the worker is waiting, for a worker that seems stuck."""
    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(limit=12, file=buf)
        sys.stderr.write(buf.getvalue())
    sys.stderr.flush()


def _hard_exit() -> None:
    log.error("shutdown took longer than %.0f s; exiting without the last commit (it will be replayed)",
              SHUTDOWN_GRACE_S)
    os._exit(3)


async def _stop_when_idle(ingestor: Any, stop: asyncio.Event, idle_s: float) -> None:
    last, since = -1, time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.2)
        st = ingestor.stats
        if st.messages != last or st.lag != 0:
            last, since = st.messages, time.monotonic()
        elif st.open_cells == 0 and st.held == 0 and time.monotonic() - since >= idle_s:
            stop.set()


@cli.command()
@click.option("--nodes", default=2, show_default=True, help="Simulated nodes.")
@click.option("--gpus", default=2, show_default=True, help="GPUs per node.")
@click.option("--duration", type=float, default=None,
              help="Seconds of event time to publish  [default: the scenario's duration_s, else 60]")
@click.option("--seed", default=0, show_default=True)
@click.option("--batch-size", default=100, show_default=True, help="Samples per message (1 = single-sample form).")
@click.option("--mode", type=click.Choice(["live", "backlog"]), default="live", show_default=True,
              help="live: in real time from now; backlog: the last DURATION seconds, as fast as possible.")
@click.option("--bad-every", default=0, help="Also send a corrupted copy of every N-th message (0 = never).")
@click.option("--clock-domains", is_flag=True,
              help="Stamp each node's GPU streams with a skewed, drifting GPU clock and publish clock.sync beacons.")
@click.option("--clock-reset", type=float, default=None, metavar="SECONDS",
              help="With --clock-domains: every node's GPU clock reboots this many seconds into the run.")
@click.option("--scenario", "scenario_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="TOML file of labelled events (efficiency drops, spikes, workload changes) to play into the "
                   "run; see deploy/scenarios/.")
@click.pass_context
def simulate(ctx: click.Context, nodes: int, gpus: int, duration: float | None, seed: int, batch_size: int, mode: str,
             bad_every: int, clock_domains: bool, clock_reset: float | None, scenario_file: str | None) -> None:
    """Publish a simulated GPU cluster (all 23 streams and K8s events) to Kafka."""
    from agents.collect.scenario_file import load_scenario
    from agents.collect.simulator import SimulatorPublisher
    from agents.kafka.admin import ensure_topics
    from streams.sim.scenario import Scenario, ScenarioError
    from streams.sim.simulate import SimParams

    settings = _settings(ctx)
    scenario: Scenario | None = None
    if scenario_file is not None:
        try:
            scenario = load_scenario(scenario_file)
            scenario.check_cluster(nodes, gpus)  # before any topic is made
        except ScenarioError as exc:
            raise click.BadParameter(str(exc), param_hint="--scenario") from None
    if duration is None:
        duration = scenario.duration_s if scenario is not None and scenario.duration_s is not None else 60.0
    if clock_reset is not None and not clock_domains:
        raise click.UsageError("--clock-reset needs --clock-domains")
    if scenario is not None:
        late = [e.index for e in scenario.events if e.start_s >= duration]
        if late:
            log.warning("scenario events %s start after the run's %g s and will not happen", late, duration)
    ensure_topics(settings)
    now = time.time_ns()
    start = now if mode == "live" else now - int(duration * 1e9)
    params = SimParams(nodes=nodes, gpus=gpus, seed=seed, start_ns=start)
    pub = SimulatorPublisher(settings, params, batch_size=batch_size, bad_every=bad_every,
                             clock_domains=clock_domains, clock_reset_s=clock_reset, scenario=scenario)
    t0 = time.monotonic()
    st = pub.live(duration) if mode == "live" else pub.backlog(duration)
    secs = time.monotonic() - t0
    report: dict[str, Any] = {"start_ns": start, **st.as_dict(), "seconds": round(secs, 3)}
    if scenario is not None:
        report["scenario"] = scenario.source
        report["scenario_events"] = len(scenario.events)
    click.echo(orjson.dumps(report).decode())


@cli.command()
@click.option("--duration", default=100.0, show_default=True,
              help="Seconds to simulate (the scheduled events of deploy/scenarios/live-demo.toml span 100 s).")
@click.option("--nodes", default=2, show_default=True, help="Simulated nodes.")
@click.option("--gpus", default=4, show_default=True, help="GPUs per node.")
@click.pass_context
def demo(ctx: click.Context, duration: float, nodes: int, gpus: int) -> None:
    """Everything on one machine: local Kafka, embedded ClickHouse, a simulated cluster, live progress."""
    from agents.cli.demo import run_demo
    from agents.runtime.gc_tuning import tune_for_throughput

    settings = _settings(ctx)
    _check_policy(settings)
    ctx.call_on_close(tune_for_throughput())
    if settings.clickhouse_backend != "chdb":
        log.info("demo uses the %s backend as configured", settings.clickhouse_backend)
    from streams.sim.scenario import ScenarioError

    try:
        run_demo(settings, duration, nodes, gpus, PROJECT_ROOT)
    except ScenarioError as exc:  # e.g. --nodes 1: the demo's scenario names node-01
        raise click.ClickException(str(exc)) from None


from agents.cli.act import act  # noqa: E402  (commands of their own modules, hung on cli here)
from agents.cli.alerts import alerts  # noqa: E402
from agents.cli.leaks import leaks  # noqa: E402
from agents.cli.sql import sql  # noqa: E402

cli.add_command(act)
cli.add_command(alerts)
cli.add_command(sql)
cli.add_command(leaks)


def main() -> None:
    cli(prog_name="flopwatch")


if __name__ == "__main__":
    main()
