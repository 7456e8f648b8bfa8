"""Publishes the simulated cluster to Kafka, as a live stream or as a backlog."""

from __future__ import annotations

import bisect
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from schemas.catalog import BY_NAME
from schemas.codec import encode_batch, encode_beacon, encode_k8s_event, encode_sample
from schemas.counters import Counters
from schemas.records import SampleBatch
from streams.align.clock import BeaconNoise, DomainClock
from streams.sim.scenario import Scenario
from streams.sim.simulate import NVML_SENSORS, ClusterSimulator, SimParams, node_name

log = logging.getLogger(__name__)
_S = 1_000_000_000
_NVML_SENSORS = len(NVML_SENSORS)  # catalog indices below this come from the GPU driver
BEACON_PREROLL_S = 10
REBOOT_DOMAIN_S = 5  # what a rebooted GPU clock reads at the reboot


@dataclass(slots=True)
class PublishStats(Counters):
    messages: int = 0
    samples: int = 0
    events: int = 0
    bad: int = 0


def batch_messages(batch: SampleBatch, batch_size: int) -> list[bytes]:
    """Wire messages for one series' samples: single-sample form when ``batch_size`` is 1."""
    if batch_size == 1:
        return [encode_sample(s) for s in batch.samples()]
    out = []
    for i in range(0, len(batch), batch_size):
        part = SampleBatch(batch.sensor, batch.node, batch.gpu, batch.ts_ns[i:i + batch_size],
                           batch.value[i:i + batch_size], batch.clock, batch.labels)
        out.append(encode_batch(part))
    return out


class SimulatorPublisher:
    """Runs ``ClusterSimulator`` and sends every sample to its ``sensors.<name>`` topic, keyed by node.

    ``bad_every`` > 0 adds one corrupted copy after every N-th message (the demo's
    rejects); the good stream is unchanged, so frames stay exact. A ``scenario`` schedules
    labelled events into the samples (``sim.truth()`` gives them at absolute times).
    """

    def __init__(self, settings: Settings, params: SimParams, batch_size: int = 100, bad_every: int = 0,
                 clock_domains: bool = False, clock_reset_s: float | None = None, record: bool = False,
                 scenario: Scenario | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.params = params
        self.clock = clock
        self.batch_size = batch_size
        self.bad_every = bad_every
        self.sim = ClusterSimulator(params, scenario)
        self.topics = Topics(settings.topic_prefix)
        self.producer = SampleProducer(settings)
        self.stats = PublishStats()
        self.sent: list[SampleBatch] = []  # every batch published, when ``record`` (for an oracle)
        self._record = record
        self._topic_of = {name: self.topics.sensor(s.index) for name, s in BY_NAME.items()}
        self.until_ns = params.start_ns  # event time published so far
        # With clock domains, each node's NVML streams are stamped by a GPU clock with a
        # known offset (-2..+2 s) and drift (up to 100 ppm), and beacons go to clock.sync.
        self.clocks: dict[str, DomainClock] = {}
        # ``clock_reset_s``: seconds after the start at which every node's GPU clock reboots
        # (within a second of each other) and restarts counting from a few seconds.
        if clock_reset_s is not None and not clock_domains:
            raise ValueError("a clock reset needs clock_domains")
        if clock_domains:
            rng = random.Random(f"{params.seed}:clocks")
            for i in range(params.nodes):
                offset = rng.randint(-2 * _S, 2 * _S)
                resets = () if clock_reset_s is None else (params.start_ns + int((clock_reset_s + rng.random()) * _S),)
                # A reboot: the domain steps back to about REBOOT_DOMAIN_S, by (roughly) what it read.
                jump = (resets[0] if resets else params.start_ns) + offset - REBOOT_DOMAIN_S * _S
                self.clocks[node_name(i)] = DomainClock(offset, rng.uniform(-100.0, 100.0), params.start_ns,
                                                        resets, jump)
        self._beacon_rng = random.Random(f"{params.seed}:beacons")
        self._noise = BeaconNoise()
        # Collectors send beacons all the time; starting them a while before the first
        # sample gives the estimator the span it needs to measure drift from the start.
        self._next_beacon_s = params.start_ns // _S - BEACON_PREROLL_S

    def _publish(self, until_ns: int) -> None:
        self.until_ns = until_ns
        st, send = self.stats, self.producer.send
        self._beacons(until_ns)
        for batch in self.sim.advance(until_ns):
            if self._record:
                self.sent.append(batch)
            topic, key = self._topic_of[batch.sensor], batch.node
            for part in self._in_domain(batch):
                for msg in batch_messages(part, self.batch_size):
                    send(topic, msg, key)
                    st.messages += 1
                    if self.bad_every and st.messages % self.bad_every == 0:
                        send(topic, msg[: len(msg) // 2], key)  # truncated JSON: malformed_json
                        st.bad += 1
            st.samples += len(batch)
        for ev in self.sim.k8s_events():
            send(self.topics.k8s_events, encode_k8s_event(ev), ev.node)
            st.events += 1
        self.producer.poll()

    def _in_domain(self, batch: SampleBatch) -> list[SampleBatch]:
        """The batch stamped by its node's GPU clock (NVML streams with clock domains on), one
        batch per clock epoch: a rebooted node's collector restarts too, so none spans a reset."""
        truth = self.clocks.get(batch.node)
        if truth is None or BY_NAME[batch.sensor].index >= _NVML_SENSORS:
            return [batch]
        clock = f"nvml:{batch.node}"
        ts = batch.ts_ns  # a series' batch is in time order: a reset cuts it at one index
        cuts = [0, *sorted({bisect.bisect_left(ts, r) for r in truth.resets_ns} - {0, len(ts)}), len(ts)]
        return [SampleBatch(batch.sensor, batch.node, batch.gpu, [truth.to_domain(t) for t in ts[a:b]],
                            batch.value[a:b], clock, batch.labels) for a, b in itertools.pairwise(cuts)]

    def backlog(self, duration_s: float, chunk_s: float | None = None) -> PublishStats:
        """Publish the next ``duration_s`` of event time as fast as Kafka takes it.

        Series are sent chunk by chunk, so a topic's event times are out of order by up
        to a chunk; the default chunk (1 s, or the span of one full batch message) keeps
        that within the worker's default allowed lateness.
        """
        if chunk_s is None:
            chunk_s = 1.0 if self.batch_size == 1 else self.batch_size * self.params.nvml_period_ns / _S
        t = self.until_ns
        end = t + int(duration_s * _S)
        while t < end:
            t = min(end, t + int(chunk_s * _S))
            self._publish(t)
        self._beacons(t + 1, final=True)  # a beacon after the last samples, so they can all be placed
        self.producer.flush()
        return self.stats

    def burst(self, duration_s: float, rng: random.Random, spread_s: float = 0.0,
              sensors: frozenset[str] | None = None) -> list[SampleBatch]:
        """Publish the next ``duration_s`` of event time at once, topic after topic in a random
        order, ``spread_s`` apart in all: what a producer flushing its buffer after a broker
        outage, a replay or a backfill sends. Within a topic, messages go in time order (the
        order a collector produced them); each series is in order. ``sensors`` limits the
        streams published. Returns the batches sent, for an oracle.
        """
        until = self.until_ns + int(duration_s * _S)
        self.until_ns = until
        self._beacons(until, final=True)
        by_topic: dict[str, list[tuple[int, float, str, bytes]]] = {}
        sent: list[SampleBatch] = []
        for batch in self.sim.advance(until):
            if sensors is not None and batch.sensor not in sensors:
                continue
            sent.append(batch)
            if self._record:
                self.sent.append(batch)
            msgs = by_topic.setdefault(self._topic_of[batch.sensor], [])
            done = 0  # samples of the batch before this part (parts split it at clock resets)
            for part in self._in_domain(batch):
                for i in range(0, len(part), self.batch_size):
                    piece = SampleBatch(part.sensor, part.node, part.gpu, part.ts_ns[i:i + self.batch_size],
                                        part.value[i:i + self.batch_size], part.clock, part.labels)
                    msgs.append((batch.ts_ns[done + i], rng.random(), batch.node, encode_batch(piece)))
                done += len(part)
            self.stats.samples += len(batch)
        topics = sorted(by_topic)
        rng.shuffle(topics)
        for topic in topics:
            for _, _, key, msg in sorted(by_topic[topic]):
                self.producer.send(topic, msg, key)
                self.stats.messages += 1
            self.producer.poll()
            time.sleep(spread_s / max(1, len(topics)))
        for ev in self.sim.k8s_events():
            self.producer.send(self.topics.k8s_events, encode_k8s_event(ev), ev.node)
            self.stats.events += 1
        self.producer.flush()
        return sent

    def _beacons(self, until_ns: int, final: bool = False) -> None:
        """One beacon per node and second of event time, read at a random instant in that second."""
        if not self.clocks:
            return
        reads: list[int] = []
        while self._next_beacon_s * _S < until_ns:
            reads.append(self._next_beacon_s * _S + self._beacon_rng.randrange(_S))
            self._next_beacon_s += 1
        if final:
            reads.append(until_ns)
        for read in reads:
            for node, truth in self.clocks.items():
                b = self._noise.beacon(self._beacon_rng, node, f"nvml:{node}", truth, read)
                self.producer.send(self.topics.clock_sync, encode_beacon(b), node)

    def live(self, duration_s: float, stop: threading.Event | None = None, step_s: float = 0.1,
             on_step: Callable[[PublishStats], None] | None = None) -> PublishStats:
        """Publish in real time: at each step, every sample whose event time has passed. Steps keep their cadence
        (a collector's timer): a step's own work does not push the next one back, which at 512 simulated GPUs
        (~35 ms a step) delayed every sample by a third of a step more."""
        end = self.until_ns + int(duration_s * _S)
        step_ns = int(step_s * _S)
        due = self.clock.wall_ns()
        while stop is None or not stop.is_set():
            now = min(self.clock.wall_ns(), end)
            self._publish(now)
            if on_step is not None:
                on_step(self.stats)
            if now >= end:
                break
            due = next_step(due, step_ns, self.clock.wall_ns())
            time.sleep(max(0.0, (due - self.clock.wall_ns()) / _S))
        self.producer.flush()
        return self.stats


def next_step(due_ns: int, step_ns: int, now_ns: int) -> int:
    """The next step's time on a fixed cadence from ``due_ns``; a step that overran skips to the next one ahead,
    rather than publishing twice in a row to catch up.

    >>> next_step(1_000, 100, 1_030), next_step(1_000, 100, 1_100), next_step(1_000, 100, 1_250)
    (1100, 1200, 1300)
    """
    due = due_ns + step_ns
    if due <= now_ns:
        due += (now_ns - due) // step_ns * step_ns + step_ns
    return due
