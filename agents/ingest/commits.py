"""Where each partition's offset commit may go: the pure arithmetic of "nothing is lost".

A commit at offset ``o`` tells Kafka every record before ``o`` is done. A sensor record
is done once its samples are in a written frame (not while an open grid cell or a
clock-domain wait still holds it); a beacon is done once no placed domain sample still
depends on the clock fit it contributed to. Everything else is done once read.

>>> from aiokafka import TopicPartition as TP
>>> read = {TP("sensors.power", 0): 120, TP("clock.sync", 0): 40, TP("k8s.events", 0): 9}
>>> commit_offsets(read, sensor_index={"sensors.power": 4}, clock_topic="clock.sync",
...                open_oldest={0: {4: 100}}, held_oldest={(0, 4): 110}, beacon_pins={0: 31})
{TopicPartition(topic='sensors.power', partition=0): 100, TopicPartition(topic='clock.sync', partition=0): 31, \
TopicPartition(topic='k8s.events', partition=0): 9}
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from aiokafka import TopicPartition


def commit_offsets(read: Mapping[TopicPartition, int], *, sensor_index: Mapping[str, int], clock_topic: str,
                   open_oldest: Mapping[int, Mapping[Hashable, int]], held_oldest: Mapping[tuple[int, int], int],
                   beacon_pins: Mapping[int, int]) -> dict[TopicPartition, int]:
    """Per partition, the offset to commit: the next offset read, held back to the oldest
    record an open cell (``open_oldest``: partition -> sensor index -> offset), a clock-domain
    wait (``held_oldest``: (partition, sensor index) -> offset) or a beacon pin still needs."""
    out: dict[TopicPartition, int] = {}
    for tp, nxt in read.items():
        held: int | None = None
        si = sensor_index.get(tp.topic)
        if si is not None:
            held = open_oldest.get(tp.partition, {}).get(si)
            w = held_oldest.get((tp.partition, si))
            if w is not None and (held is None or w < held):
                held = w
        elif tp.topic == clock_topic:
            held = beacon_pins.get(tp.partition)
        out[tp] = nxt if held is None else min(nxt, held)
    return out
