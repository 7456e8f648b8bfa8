"""``flopwatch schema json TOPIC``: print the JSON Schema of a topic (``schemas/topic_schemas.py``);
``flopwatch schema export DIR``: write the generated ones as files (how ``schemas/json/`` is made)."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from schemas.topic_schemas import SHIPPED, TOPIC_NAMES, UnknownTopicError, schema_for, shipped_file

_HELP = ("Print the JSON Schema (draft 2020-12) of TOPIC, e.g. sensors.power, k8s.events, flopwatch.alerts. "
         "The configured topic prefix (FLOPWATCH_TOPIC_PREFIX) may be given or left out.\n\nTopics: "
         + ", ".join(TOPIC_NAMES))


@click.command("json", help=_HELP)
@click.argument("topic", metavar="TOPIC")
@click.pass_context
def schema_command(ctx: click.Context, topic: str) -> None:
    prefix = getattr(ctx.obj, "topic_prefix", "") or ""
    name = topic.removeprefix(prefix) if prefix else topic
    try:
        schema = schema_for(name)
    except UnknownTopicError as exc:
        raise click.BadParameter(str(exc), param_hint="TOPIC") from None
    click.echo(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode())


@click.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def export_command(directory: Path) -> None:
    """Write every generated topic schema into DIRECTORY (the shipped copies: schemas/json).

    A file that already holds an equal schema is left as it is, so hand-formatted files keep their layout.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for topic in SHIPPED:
        path = directory / shipped_file(topic)
        schema = schema_for(topic)
        if path.exists() and orjson.loads(path.read_bytes()) == schema:
            continue
        path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n")
        click.echo(f"wrote {path}")
