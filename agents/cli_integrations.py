"""``flopwatch collect …`` and ``flopwatch schema …``: the producer integrations' commands, loaded lazily."""

from __future__ import annotations

import click

from agents.cli_lazy import LazyGroup


@click.group(cls=LazyGroup, lazy_commands={"nvml": "agents.cli_nvml:nvml_command",
                                           "k8s": "agents.collect_k8s:k8s_command"})
def collect() -> None:
    """Collectors that publish a node's GPUs (NVML) or the cluster's events and pods (Kubernetes) to Kafka."""


@click.group(cls=LazyGroup, lazy_commands={"json": "agents.schema_cli:schema_command",
                                           "export": "agents.schema_cli:export_command"})
def schema() -> None:
    """The contracts of flopwatch's topics."""
