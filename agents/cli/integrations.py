"""``flopwatch collect …`` and ``flopwatch schema …``: the producer integrations' commands, loaded lazily."""

from __future__ import annotations

import click

from agents.cli.lazy import LazyGroup


@click.group(cls=LazyGroup, lazy_commands={"nvml": "agents.cli.nvml:nvml_command",
                                           "k8s": "agents.collect.k8s:k8s_command"})
def collect() -> None:
    """Collectors that publish a node's GPUs (NVML) or the cluster's events and pods (Kubernetes) to Kafka."""


@click.group(cls=LazyGroup, lazy_commands={"json": "agents.cli.schema:schema_command",
                                           "export": "agents.cli.schema:export_command",
                                           "migrate": "agents.cli.schema_db:migrate_command",
                                           "show": "agents.cli.schema_db:show_command"})
def schema() -> None:
    """The contracts of flopwatch's topics (json, export) and its ClickHouse schema (migrate, show)."""
