"""The worker's clock-domain bookkeeping: holding, placing, expiring, and the offsets commits keep."""

from __future__ import annotations

import time

import pytest
from aiokafka import ConsumerRecord

import streams.align.clock_domains as clocks
from agents.runtime.timebase import ManualClock
from schemas.catalog import BY_NAME
from schemas.records import ClockBeacon, SampleBatch
from streams.align.aligner import AlignParams, GridAligner
from streams.align.clock import ClockParams
from streams.align.clock_domains import ClockDomains

S = 1_000_000_000
T0 = 1_796_200_000 * S
OFFSET = 3 * S  # utc = domain + OFFSET in this domain
POWER = BY_NAME["power"].index


def record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, offset, 0, 0, b"n", b"{}", None, 1, 2, [])


def batch(domain_ns: int) -> SampleBatch:
    return SampleBatch("power", "n", "0", [domain_ns], [300.0], "nvml:n", None, domain_ns, domain_ns)


def beacon(domain_ns: int) -> ClockBeacon:
    return ClockBeacon("n", "nvml:n", domain_ns, domain_ns + OFFSET - 10, domain_ns + OFFSET + 10)


def test_a_message_waits_for_a_later_beacon_and_holds_its_partition_meanwhile() -> None:
    doms = ClockDomains(ClockParams(), wait_s=60.0, mono_ns=time.monotonic_ns)
    aligner = GridAligner(AlignParams(allowed_lateness_ns=0))
    waiting: dict[int, clocks.Waiting] = {0: {}}
    doms.offer(0, aligner, waiting[0], record(5), batch(100 * S), POWER)
    assert doms.place_held({0: aligner}, waiting) == {0: 0}  # no fit at all: nothing may close
    assert doms.held == 1 and doms.oldest_held() == {(0, POWER): 5}

    doms.beacon(0, beacon(99 * S), offset=40)  # before the sample: still no beacon after it
    hold = doms.place_held({0: aligner}, waiting)
    assert doms.held == 1 and hold == {0: 100 * S + OFFSET}  # where it will land, roughly

    doms.beacon(0, beacon(101 * S), offset=41)
    assert doms.place_held({0: aligner}, waiting) == {} and doms.held == 0
    frames = aligner.flush_all().frames.frames()
    assert [f.tick_ns for f in frames] == [(100 * S + OFFSET) // S * S]
    # The placed sample's open cell pins the beacon window its fit came from.
    assert doms.pins({0: {POWER: 5}}) == {0: 40}
    assert not doms.expired


def test_a_message_with_a_beacon_already_read_is_placed_at_once() -> None:
    doms = ClockDomains(ClockParams(), wait_s=60.0, mono_ns=time.monotonic_ns)
    aligner = GridAligner(AlignParams(allowed_lateness_ns=0))
    doms.beacon(0, beacon(101 * S), offset=7)
    waiting: clocks.Waiting = {}
    doms.offer(0, aligner, waiting, record(3), batch(100 * S), POWER)
    assert doms.held == 0 and (POWER, 3) in waiting


def test_waiting_too_long_or_in_a_full_list_ends_in_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(mono_ns=100 * S)
    doms = ClockDomains(ClockParams(), wait_s=5.0, mono_ns=clock.mono_ns)
    aligner = GridAligner(AlignParams())
    waiting: dict[int, clocks.Waiting] = {0: {}}
    doms.offer(0, aligner, waiting[0], record(1), batch(100 * S), POWER)
    clock.advance(4 * S)
    doms.place_held({0: aligner}, waiting)
    assert doms.held == 1 and not doms.expired  # 4 s of the 5 s wait
    clock.advance(2 * S)
    doms.place_held({0: aligner}, waiting)
    assert [(p, h.rec.offset) for p, h, _ in doms.expired] == [(0, 1)] and doms.held == 0
    assert "none within 5 s" in doms.expired[0][2]

    monkeypatch.setattr(clocks, "MAX_HELD", 2)
    doms = ClockDomains(ClockParams(), wait_s=5.0, mono_ns=time.monotonic_ns)
    for off in range(3):
        doms.offer(0, aligner, waiting[0], record(off), batch(100 * S + off), POWER)
    assert [h.rec.offset for _, h, _ in doms.expired] == [0] and doms.held == 2  # the oldest gave way
    doms.drop(0)
    assert doms.held == 0 and doms.pins({}) == {}


def sync(node: str, domain_ns: int) -> ClockBeacon:
    return ClockBeacon(node, f"nvml:{node}", domain_ns, T0 + domain_ns, T0 + domain_ns + 20)


def test_a_domain_silent_while_the_others_go_on_is_dropped_once_nothing_waits_and_stops_pinning_the_commit() -> None:
    doms = ClockDomains(ClockParams(), wait_s=60.0, mono_ns=time.monotonic_ns, forget_ns=3600 * S)
    aligner = GridAligner(AlignParams(allowed_lateness_ns=0))
    doms.beacon(0, sync("n", 100 * S), offset=1)  # node n, then it goes away
    waiting: clocks.Waiting = {}
    held = SampleBatch("power", "n", "0", [200 * S], [300.0], "nvml:n", None, 200 * S, 200 * S)
    doms.offer(0, aligner, waiting, record(2), held, POWER)  # its last sample waits for a beacon
    for i in range(1, 300):  # node m's domain goes on, a beacon every 30 s for 2.5 h
        doms.beacon(0, sync("m", 100 * S + i * 30 * S), offset=10 + i)
    assert doms.domains == 2 and doms.forgotten == 0  # silent for 2.5 h, but a message waits for it
    doms._parts[0].held[("n", "nvml:n")].items.clear()  # it expired (the ingest dead-letters it)
    for i in range(300, 300 + 16):
        doms.beacon(0, sync("m", 100 * S + i * 30 * S), offset=10 + i)
    assert doms.domains == 1 and doms.forgotten == 1
    m_pin = doms._parts[0].tracks[("m", "nvml:m")].pin()
    assert m_pin is not None and m_pin > 10 and doms.pins({0: {}}) == {0: m_pin}  # n's offset 1 pins no more


def test_an_outage_drops_no_domain() -> None:
    doms = ClockDomains(ClockParams(), wait_s=60.0, mono_ns=time.monotonic_ns, forget_ns=3600 * S)
    doms.beacon(0, sync("n", 100 * S), offset=1)
    doms.beacon(0, sync("m", 100 * S), offset=2)
    # Four hours without a beacon (the broker was down), then m speaks first: n is not gone for that.
    for i in range(20):
        doms.beacon(0, sync("m", 4 * 3600 * S + i * 30 * S), offset=3 + i)
    assert doms.domains == 2 and doms.forgotten == 0
