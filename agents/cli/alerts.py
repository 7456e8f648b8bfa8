"""``flopwatch alerts …``: consumers of the ``flopwatch.alerts`` topic (see ``agents/sinks/alertmanager.py``)."""

from __future__ import annotations

import sys

import click

from agents.runtime.entry import run_until_signal, stopped, write_summary
from agents.settings import Settings


@click.group()
def alerts() -> None:
    """Consumers of the flopwatch.alerts topic."""


@alerts.command()
@click.option("--alertmanager", "url", envvar="FLOPWATCH_ALERTMANAGER_URL", required=True, metavar="URL",
              help="Alertmanager base URL, e.g. http://127.0.0.1:9094 (default: $FLOPWATCH_ALERTMANAGER_URL); "
                   "user:password@ in it is sent as basic auth and never logged.")
@click.option("--resend-s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Re-send every firing alert this often.")
@click.option("--ends-after-s", type=click.FloatRange(min=0.1), default=None,
              help="endsAt of a firing alert, this far after each send [default: 4 x --resend-s]. "
                   "Alertmanager ends an alert that is not re-sent by then.")
@click.option("--group", default=None, metavar="NAME",
              help="Consumer group: forwarders sharing one split the partitions. Default: read every partition.")
@click.option("--generator-url", default="", metavar="TEMPLATE",
              help="generatorURL of each alert, with {id}, {rule}, {node}, {gpu} filled in. Default: none.")
@click.option("--resolved-window-s", type=click.FloatRange(min=0.0), default=3600.0, show_default=True,
              help="On start, re-post resolutions at most this old (their alert may still be active).")
@click.pass_context
def forward(ctx: click.Context, url: str, resend_s: float, ends_after_s: float | None, group: str | None,
            generator_url: str, resolved_window_s: float) -> None:
    """Keep Prometheus Alertmanager in step with flopwatch.alerts until SIGTERM/SIGINT.

    Rebuilds the firing alerts from the start of the topic, then posts them and every new
    message to POST /api/v2/alerts, re-sending firing ones every --resend-s.
    """
    from aiokafka.errors import KafkaError

    from agents.kafka.admin import ensure_topics
    from agents.sinks.alertmanager import AlertForwarder, ForwardParams, ForwardStats

    settings: Settings = ctx.obj
    try:
        params = ForwardParams.from_seconds(resend_s, ends_after_s, generator_url=generator_url,
                                            resolved_window_ns=int(resolved_window_s * 1e9))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    ensure_topics(settings)
    forwarder = AlertForwarder(settings, url, params, group=group)

    try:
        st: ForwardStats = run_until_signal(forwarder.run)
    except (KafkaError, RuntimeError) as exc:
        raise click.ClickException(f"alert forwarder stopped: {exc}") from None
    write_summary(stopped(st), sys.stdout)
