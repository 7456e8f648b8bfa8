"""A simulator run through the ingest's real core into a ClickHouse backend: what the SQL tests and the storage
benchmark query.

No Kafka: the simulator's messages become records of one partition per topic, fed to ``IngestCore``
ten seconds of event time at a time, each poll's frames written by a ``FrameStore`` as the worker does.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from agents.ingest.core import IngestCore
from agents.ingest.pricebook_file import PriceBookFile
from agents.kafka.topics import Topics
from agents.runtime.timebase import ManualClock
from agents.settings import load_settings
from agents.sinks.clickhouse import Backend
from agents.sinks.store import FrameStore, Progress
from schemas.catalog import BY_NAME
from schemas.codec import encode_batch, encode_k8s_event
from schemas.records import Reject
from streams.align.aligner import Recovered
from streams.efficiency.enrich import Enricher
from streams.sim.simulate import ClusterSimulator, SimParams

S = 1_000_000_000


class _Refused:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None:
        self.counts[reject.reason.value] += 1


def ingest_simulation(backend: Backend, params: SimParams, seconds: int, chunk_s: int = 10,
                      store: FrameStore | None = None) -> int:
    """Frames of ``seconds`` of the simulated cluster written to ``backend`` (through ``store``, one that has
    recovered, say); returns the rows written."""
    settings = load_settings({}, topic_prefix="sim.", partitions=1, lateness_ms=1000, source_idle_s=1.0)
    topics = Topics("sim.")
    topic_of = {name: topics.sensor(s.index) for name, s in BY_NAME.items()}
    store, refused = store or FrameStore(backend), _Refused()
    clock = ManualClock(wall_ns=params.start_ns, mono_ns=0)
    enricher = Enricher(PriceBookFile(None, clock).current, settings.align_params().grid_ns)  # the shipped prices
    core = IngestCore(settings, store, refused, clock, enricher)
    tps = [TopicPartition(t, 0) for t in topics.inputs]
    core.assign(tps, Progress(Recovered()))
    sim = ClusterSimulator(params)
    offsets: dict[str, int] = defaultdict(int)
    written = 0
    for t in range(chunk_s, seconds + chunk_s, chunk_s):
        poll: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = defaultdict(list)
        records = [(topics.k8s_events, ev.node, encode_k8s_event(ev)) for ev in sim.k8s_events()]
        records += [(topic_of[b.sensor], b.node, encode_batch(b))
                    for b in sim.advance(params.start_ns + min(t, seconds) * S)]
        for topic, key, raw in records:
            off = offsets[topic]
            offsets[topic] += 1
            poll[TopicPartition(topic, 0)].append(ConsumerRecord(topic, 0, off, 0, 0, key.encode(), raw, None,
                                                                 len(key), len(raw), []))
        core.handle(poll)
        clock.advance(chunk_s * S)
        quiet = 0 if t < seconds else 60 * S  # at the end every stream is quiet: the tail closes
        core.advance({tp: quiet for tp in tps})
        consumed = {(topic, 0): n for topic, n in offsets.items()}
        written += store.write(store.detach(), consumed, clock.wall_ns() // 1_000_000, core.closed_ticks())
    if refused.counts:
        raise RuntimeError(f"the simulator's records were refused: {refused.counts}")
    return written
