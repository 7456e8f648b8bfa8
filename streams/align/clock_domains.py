"""Clock-domain samples of one worker: beacons, samples waiting for one, and what commits must keep.

A sample stamped by a clock domain other than UTC is never placed on a guessed time.
It is corrected with the fit of the first ``clock.sync`` beacon of its domain read
after it (``streams.align.clock.DomainTrack``): at once when that beacon is already here,
otherwise it waits, in a bounded list per domain, and holds its partition's cells
open meanwhile. One that waits longer than the configured time is handed back for the
dead-letter topic (``no_clock``).

Replays must rebuild the same fits, so the ``clock.sync`` offset a partition commits
is held back to the oldest beacon still needed: by samples sitting in open cells, and
by the newest fit of every kept epoch (for the samples still to come).

A domain that has been silent for ``forget_ns`` while the partition's other domains went on,
with nothing waiting for it, is dropped: a node that went away would otherwise keep its track
and, with its pin, hold the partition's ``clock.sync`` commit where its last beacon was. The
partition's beacon time counts in steps of at most ``STEP_CAP_NS``, so an outage after which
every domain speaks again (collectors send what they buffered) drops nothing; a domain that
speaks after it was dropped starts afresh.

The messages are the consumer's records, of any type with an ``offset``; the caller gets them
back (in ``waiting`` and ``expired``) to dead-letter or to answer a late verdict with.
Monotonic time (``mono_ns``) is an argument, so tests drive the wait with a fake clock.

>>> from schemas.records import ClockBeacon, SampleBatch
>>> from streams.align.aligner import AlignParams, GridAligner
>>> from streams.align.clock import ClockParams
>>> class Rec:
...     offset = 5
>>> doms = ClockDomains(ClockParams(), wait_s=10.0, mono_ns=lambda: 0)
>>> aligner, waiting = GridAligner(AlignParams()), {0: {}}
>>> sample = SampleBatch("power", "n", "0", [100], [300.0], "nvml:n", None, 100, 100)
>>> doms.offer(0, aligner, waiting[0], Rec(), sample, 4)
>>> doms.held, doms.oldest_held()
(1, {(0, 4): 5})
>>> doms.beacon(0, ClockBeacon("n", "nvml:n", 200, 1_000_200, 1_000_210), offset=9)
>>> doms.place_held({0: aligner}, waiting), doms.held, list(waiting[0])
({}, 0, [(4, 5)])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from schemas.records import ClockBeacon, SampleBatch
from streams.align.aligner import GridAligner
from streams.align.clock import ClockFit, ClockParams, DomainTrack

# The consumer's record (aiokafka's ConsumerRecord in the worker), handed back as it came; only its
# ``offset`` is read here.
Record = Any
MAX_HELD = 100_000  # clock-domain messages waiting for a beacon, per domain
STEP_CAP_NS = 60_000_000_000  # the most one beacon moves a partition's beacon time on (see the docstring)
Domain = tuple[str, str]  # (node, clock)
Waiting = dict[tuple[int, int], Record]  # (topic index, offset) -> record


@dataclass(slots=True)
class Held:
    """A sample message in a clock domain, waiting for a beacon read after it."""

    rec: Record
    batch: SampleBatch
    sensor: int
    since: float
    lo: int  # earliest and latest domain time in the message
    hi: int


@dataclass(slots=True)
class _DomainWait:
    """Messages of one domain waiting for a beacon, oldest first."""

    items: list[Held] = field(default_factory=list)
    tried: int = -1  # beacons the domain had when placement was last tried
    guess: int | None = None  # earliest UTC the waiting samples will land at, roughly


@dataclass(slots=True)
class _Partition:
    """One partition's domains: their tracks, what waits for a beacon, and the placed messages'
    beacon pins as (topic index, offset, pin)."""

    tracks: dict[Domain, DomainTrack] = field(default_factory=dict)
    held: dict[Domain, _DomainWait] = field(default_factory=dict)
    placed: list[tuple[int, int, int]] = field(default_factory=list)
    # The partition's beacon time: its newest beacon's UTC, and how far the beacons have gone on, counting
    # each step forward up to STEP_CAP_NS (a jump is an outage, not time in which a domain stayed silent).
    newest_utc: int | None = None
    went_on: int = 0
    last_heard: dict[Domain, int] = field(default_factory=dict)  # went_on at each domain's last beacon
    swept: int = 0  # went_on at the last sweep

    def heard(self, key: Domain, utc_ns: int) -> None:
        if self.newest_utc is None:
            self.newest_utc = utc_ns
        elif utc_ns > self.newest_utc:
            self.went_on += min(utc_ns - self.newest_utc, STEP_CAP_NS)
            self.newest_utc = utc_ns
        self.last_heard[key] = self.went_on

    def sweep(self, forget_ns: int) -> int:
        """Drop the domains silent for ``forget_ns`` of the partition's beacon time with nothing waiting; how
        many went."""
        self.swept = self.went_on
        gone = [k for k, t in self.last_heard.items() if self.went_on - t > forget_ns and not self._waits(k)]
        for key in gone:
            del self.last_heard[key]
            self.tracks.pop(key, None)
            self.held.pop(key, None)
        return len(gone)

    def _waits(self, key: Domain) -> bool:
        wait = self.held.get(key)
        return wait is not None and bool(wait.items)

    def place(self, aligner: GridAligner, waiting: Waiting, rec: Record, batch: SampleBatch,
              sensor: int, fit: ClockFit, pin: int) -> None:
        aligner.add(batch.node, batch.gpu, sensor, batch.ts_ns, batch.value, batch.labels, sensor, rec.offset, fit)
        waiting[(sensor, rec.offset)] = rec
        self.placed.append((sensor, rec.offset, pin))


class ClockDomains:
    """The worker's clock domains, per partition number. ``expired`` collects what to dead-letter."""

    def __init__(self, params: ClockParams, wait_s: float, mono_ns: Callable[[], int],
                 forget_ns: int = 3_600_000_000_000) -> None:
        self._params = params
        self._mono_ns = mono_ns
        self._wait_s = wait_s
        self._forget_ns = forget_ns
        self.forgotten = 0  # domains dropped so far
        self._parts: dict[int, _Partition] = {}
        self.expired: list[tuple[int, Held, str]] = []  # (partition, message, why) for no_clock

    def _part(self, partition: int) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        return part

    def beacon(self, partition: int, b: ClockBeacon, offset: int) -> None:
        part = self._part(partition)
        key = (b.node, b.clock)
        track = part.tracks.get(key)
        if track is None:
            track = part.tracks[key] = DomainTrack(self._params)
        track.add(b, offset)
        part.heard(key, b.utc_after_ns)
        if part.went_on - part.swept >= self._forget_ns // 8:  # a pass over the domains now and then
            self.forgotten += part.sweep(self._forget_ns)

    @property
    def domains(self) -> int:
        return sum(len(part.tracks) for part in self._parts.values())

    def offer(self, partition: int, aligner: GridAligner, waiting: Waiting, rec: Record,
              batch: SampleBatch, sensor: int) -> None:
        """Place a domain message if its beacon is here, else hold it."""
        part = self._part(partition)
        key = (batch.node, batch.clock)
        lo, hi = batch.span
        track = part.tracks.get(key)
        found = track.fit_for(lo, hi) if track is not None else None
        if found is not None:
            part.place(aligner, waiting, rec, batch, sensor, *found)
            return
        wait = part.held.get(key)
        if wait is None:
            wait = part.held[key] = _DomainWait()
        if len(wait.items) >= MAX_HELD:  # bounded: the oldest waiter gives way
            self.expired.append((partition, wait.items.pop(0), "the waiting list is full"))
        wait.items.append(Held(rec, batch, sensor, self._mono_ns() / 1e9, lo, hi))

    def place_held(self, aligners: dict[int, GridAligner], waiting: dict[int, Waiting]) -> dict[int, int]:
        """Correct and place held messages whose domain has a beacon after them; move the ones
        that waited too long to ``expired``; per partition, the event time still held back."""
        hold: dict[int, int] = {}
        now = self._mono_ns() / 1e9
        for p, part in self._parts.items():
            aligner = aligners.get(p)
            if aligner is None:
                continue
            for key, wait in part.held.items():
                if not wait.items:
                    continue
                track = part.tracks.get(key)
                version = track.added if track is not None else 0
                # Retry only when the domain got a beacon since the last try (or one waited too long).
                if version != wait.tried or now - wait.items[0].since > self._wait_s:
                    wait.tried = version
                    wait.items, wait.guess = self._try_place(p, part, aligner, waiting.setdefault(p, {}), track,
                                                             wait.items, now - self._wait_s)
                if wait.guess is not None:  # where the rest will land, roughly: cells there stay open
                    hold[p] = min(hold.get(p, wait.guess), wait.guess)
        return hold

    def _try_place(self, p: int, part: _Partition, aligner: GridAligner, waiting: Waiting,
                   track: DomainTrack | None, items: list[Held], expired: float) -> tuple[list[Held], int | None]:
        keep: list[Held] = []
        guess: int | None = None
        latest = track.latest if track is not None else None
        for h in items:
            found = track.fit_for(h.lo, h.hi) if track is not None else None
            if found is not None:
                part.place(aligner, waiting, h.rec, h.batch, h.sensor, *found)
            elif h.since < expired:
                self.expired.append((p, h, f"none within {self._wait_s:g} s"))
            else:
                keep.append(h)
                # With no fit yet the sample could land anywhere within the domain's offset, so
                # nothing of the partition may close until a beacon (or the wait) decides it.
                at = latest.to_utc(h.lo) if latest is not None else 0
                guess = at if guess is None else min(guess, at)
        return keep, guess

    @property
    def held(self) -> int:
        return sum(len(w.items) for part in self._parts.values() for w in part.held.values())

    def oldest_held(self) -> dict[tuple[int, int], int]:
        """Per (partition, topic index), the oldest offset still waiting: commits stay below it."""
        out: dict[tuple[int, int], int] = {}
        for p, part in self._parts.items():
            for wait in part.held.values():
                for h in wait.items:
                    key = (p, h.sensor)
                    if h.rec.offset < out.get(key, h.rec.offset + 1):
                        out[key] = h.rec.offset
        return out

    def pins(self, oldest: dict[int, dict[Hashable, int]]) -> dict[int, int]:
        """Per partition, the oldest clock.sync offset a replay needs to rebuild every fit still in
        use: fits of samples in open cells (``oldest``: each aligner's oldest open position per
        topic), and the newest fit of every epoch kept (for samples to come)."""
        pins: dict[int, int] = {}
        for p, part in self._parts.items():
            open_from = oldest.get(p, {})
            part.placed[:] = [x for x in part.placed if x[1] >= open_from.get(x[0], x[1] + 1)]
            needs = [pin for _, _, pin in part.placed]
            needs += [pin for track in part.tracks.values() if (pin := track.pin()) is not None]
            if needs:
                pins[p] = min(needs)
        return pins

    def drop(self, partition: int) -> None:
        """Forget a revoked partition: its next owner rebuilds all of it from Kafka."""
        self._parts.pop(partition, None)
