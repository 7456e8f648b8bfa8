"""``flopwatch act``: the command around ``agents.act.consumer.TriggerConsumer``."""

from __future__ import annotations

import click

from agents.runtime.entry import run_until_signal, settings_of, stopped, write_summary


@click.command()
@click.option("--dry-run", "dry_run", is_flag=True,
              help="Print the kubectl command each trigger asks for, one line each (the default).")
@click.option("--webhook", "webhook", default=None, metavar="URL",
              help="POST each trigger's JSON to URL with an Idempotency-Key header, retrying until it answers "
                   "2xx; user:password@ in it is sent as basic auth and never logged.")
@click.option("--exec", "execute", is_flag=True, help="Run kubectl for each trigger (an argument list, no shell).")
@click.option("--kubectl", default="kubectl", show_default=True, metavar="PATH", help="The kubectl --exec runs.")
@click.option("--state", "state", type=click.Path(dir_okay=False), default=".flopwatch/act.sqlite",
              show_default=True, help="SQLite ledger of the idempotency keys acted on (one process at a time).")
@click.option("--retain-days", type=click.FloatRange(min=0.0, min_open=True), default=7.0, show_default=True,
              help="Keys of triggers older than this are purged from the ledger; such triggers are not acted on.")
@click.option("--from-beginning", is_flag=True,
              help="A group without committed offsets starts at the oldest trigger on the topic, not the newest.")
@click.option("--group", default=None, metavar="NAME",
              help="Consumer group [default: $FLOPWATCH_GROUP_ID-act, or -act-dry-run for --dry-run].")
@click.option("--exit-when-idle", type=click.FloatRange(min=0.0), default=None, metavar="SECONDS",
              help="Exit once every partition is read to its end and nothing new came for SECONDS.")
@click.pass_context
def act(ctx: click.Context, dry_run: bool, webhook: str | None, execute: bool, kubectl: str, state: str,
        retain_days: float, from_beginning: bool, group: str | None, exit_when_idle: float | None) -> None:
    """Act once per idempotency key on flopwatch.triggers (read_committed) until SIGTERM/SIGINT.

    The act, then the key in the --state ledger, then the offset commit: a restart skips what it did.
    """
    from aiokafka.errors import KafkaError

    from agents.act.consumer import DAY_NS, ActParams, ActStats, TriggerConsumer
    from agents.act.ledger import ActLedger, LedgerError
    from agents.act.sinks import DryRunSink, KubectlSink, Sink, WebhookSink
    from agents.kafka.admin import ensure_topics

    if dry_run + (webhook is not None) + execute > 1:
        raise click.UsageError("choose one of --dry-run, --webhook URL and --exec")
    settings = settings_of(ctx)
    sink: Sink = (WebhookSink(webhook) if webhook is not None else KubectlSink(kubectl) if execute
                  else DryRunSink())
    params = ActParams(group=group or f"{settings.group_id}-act{'-dry-run' if sink.mode == 'dry-run' else ''}",
                       from_beginning=from_beginning, retain_ns=int(retain_days * DAY_NS),
                       exit_when_idle_s=exit_when_idle)
    ensure_topics(settings)

    try:
        with ActLedger(state, sink.mode) as ledger:
            st: ActStats = run_until_signal(TriggerConsumer(settings, sink, ledger, params).run)
    except (LedgerError, KafkaError, RuntimeError) as exc:
        raise click.ClickException(f"flopwatch act stopped: {exc}") from None
    # stdout holds the dry run's commands and nothing else; the summary goes with the logs.
    write_summary(stopped(st))
