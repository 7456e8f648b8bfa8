"""Where a restarted K8s collector resumes (see ``agents.collect.k8s``): its state file, written
atomically, and the dedupe ids the ``k8s.events`` topic received after the offsets that file holds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click
import orjson

from agents.kafka.topics import confluent_config
from agents.settings import Settings

DEDUPE_HEADER = "flopwatch.k8s.id"
STATE_FORMAT = 1


class StateFile:
    """The collector's state, written atomically (temp file, fsync, rename) so a crash leaves the old one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise click.ClickException(f"cannot read the collector state {self.path}: {exc} "
                                       "(delete it to start over: every live object is then published again)") from None
        if data.get("format") != STATE_FORMAT:
            raise click.ClickException(f"{self.path}: state format {data.get('format')!r}, expected {STATE_FORMAT}")
        return data

    def save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps({"format": STATE_FORMAT, **data}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class TopicLedger:
    """The k8s.events topic's end offsets, and the dedupe ids written after given offsets."""

    def __init__(self, settings: Settings, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self._consumer = Consumer(confluent_config(settings) | {
            "group.id": "flopwatch-collect-k8s", "enable.auto.commit": False, "enable.partition.eof": True})

    def partitions(self) -> list[int]:
        meta = self._consumer.list_topics(self.topic, timeout=30)
        tmeta = meta.topics.get(self.topic)
        if tmeta is None or tmeta.error is not None:
            raise click.ClickException(f"topic {self.topic} is not there: {tmeta.error if tmeta else 'unknown'}")
        return sorted(tmeta.partitions)

    def end_offsets(self) -> dict[str, int]:
        from confluent_kafka import TopicPartition

        return {str(p): self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30,
                                                             cached=False)[1] for p in self.partitions()}

    def ids_since(self, offsets: dict[str, int]) -> list[str]:
        from confluent_kafka import KafkaError, TopicPartition

        ends = self.end_offsets()
        todo = {int(p) for p, end in ends.items() if end > offsets.get(p, 0)}
        if not todo:
            return []
        self._consumer.assign([TopicPartition(self.topic, p, offsets.get(str(p), 0)) for p in todo])
        ids: list[str] = []
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            msg = self._consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise click.ClickException(f"reading back {self.topic}: {err}")
            if (msg.offset() or 0) >= ends[str(msg.partition())] - 1:
                todo.discard(msg.partition())
            val = header_text(msg.headers(), DEDUPE_HEADER)
            if val:
                ids.append(val)
        if todo:
            raise click.ClickException(f"could not read back {self.topic} partitions {sorted(todo)} in 120 s")
        self._consumer.unassign()
        return ids

    def close(self) -> None:
        self._consumer.close()


def header_text(headers: Any, name: str) -> str | None:
    """One header's value as text; librdkafka hands headers over as pairs (or a dict)."""
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for key, val in pairs:
        if key == name and val is not None:
            return val.decode() if isinstance(val, bytes) else str(val)
    return None
