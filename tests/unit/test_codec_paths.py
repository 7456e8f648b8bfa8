"""The msgspec fast path of ``decode_samples`` against the checked orjson path: on any message, mutated valid
ones and arbitrary bytes, both give the same batch or the same reject (reason and detail)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from schemas.codec import TimeLimits, _fast, _Refused, _samples, decode_samples
from schemas.poll_decode import decode_poll, decode_sample_messages
from schemas.records import Reject, SampleBatch

NOW = 1_800_000_000_000_000_000
LIMITS = TimeLimits(NOW)
odd = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3), st.just([]),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
good_stamp = st.integers(min_value=NOW - 86_400 * 10**9, max_value=NOW + 100 * 10**9)
stamp = st.one_of(st.integers(min_value=NOW - 8 * 86_400 * 10**9, max_value=NOW + 400 * 10**9), odd)
good_number = st.one_of(st.floats(min_value=0.0, max_value=100.0), st.integers(min_value=0, max_value=100))
number = st.one_of(st.floats(min_value=-10.0, max_value=6000.0), st.integers(min_value=-5, max_value=6000), odd)
labels = st.one_of(st.none(), st.none(), odd, st.dictionaries(
    st.sampled_from(["pod", "rank", "pid", "workload", "region", "x"]),
    st.one_of(st.text(max_size=3), st.integers(min_value=-3, max_value=3), odd), max_size=3))


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(min_value=0, max_value=4))
    def mostly(good: object, *bad: object) -> object:  # a valid value four times in five
        return draw(st.sampled_from([good] * (4 * len(bad)) + list(bad)))

    doc: dict[str, Any] = {"v": mostly(1, 2, 1.0, True, "1"), "node": mostly("n0", "", 3),
                           "gpu": mostly("0", "", None), "clock": mostly("utc", "nvml:n0", "", 5),
                           "labels": draw(labels), "sensor": mostly("power", "gpu_util", 1)}
    if draw(st.booleans()):
        del doc["sensor"]  # optional, and mostly left out
    ts, v = (good_stamp, good_number) if draw(st.booleans()) else (stamp, number)  # half all in range
    if draw(st.booleans()):
        doc["ts_ns"] = draw(st.lists(ts, min_size=n, max_size=n + draw(st.sampled_from([0, 0, 0, 1]))))
        doc["value"] = draw(st.lists(v, min_size=n, max_size=n))
    else:
        doc["ts_ns"], doc["value"] = draw(ts), draw(v)
    if draw(st.integers(0, 4)) == 0:
        for key in draw(st.lists(st.sampled_from(sorted(doc)), min_size=1, max_size=2)):
            doc.pop(key, None)  # a missing field, or two
    raw = json.dumps(doc, separators=(",", ":")).encode()  # orjson writes no integer beyond 64 bits
    tweak = draw(st.sampled_from([""] * 9 + ["dup", "cut", "nan"]))
    if tweak == "dup":  # a repeated key: both parsers keep the last
        raw = raw[:-1] + b',"node":"n9"}'
    elif tweak == "cut":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif tweak == "nan":
        raw = raw.replace(b"6000.0", b"NaN").replace(b'"v":1', b'"v":1e400')
    return raw


def checked(raw: bytes, sensor: str) -> SampleBatch | Reject:
    try:
        return _samples(raw, sensor, LIMITS)
    except _Refused as refused:
        return refused.reject


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.sampled_from(["power", "power", "power", "gpu_util", "xid_errors", "nope"]))
def test_the_fast_path_and_the_checked_path_agree_on_any_message(raw: bytes, sensor: str) -> None:
    got = decode_samples(raw, sensor, LIMITS)
    event("accepted" if isinstance(got, SampleBatch) else got.reason.value)  # what the examples cover
    assert got == checked(raw, sensor)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64))
def test_they_agree_on_arbitrary_bytes(raw: bytes) -> None:
    assert decode_samples(raw, "power", LIMITS) == checked(raw, "power")


def test_the_fast_path_takes_ordinary_messages() -> None:
    raw = orjson.dumps({"v": 1, "node": "n0", "gpu": "0", "ts_ns": [NOW, NOW + 1], "value": [1, 2.5],
                        "labels": {"pod": "p", "rank": 0, "other": [1]}})
    fast = _fast(raw, "power", LIMITS)
    assert fast is not None and fast == checked(raw, "power")
    assert list(fast.value) == [1.0, 2.5] and fast.labels == {"pod": "p", "rank": 0}


def plain(got: SampleBatch | Reject) -> object:
    """A result with its columns as lists: a poll's batches hold numpy views, a lone message's packed arrays."""
    if isinstance(got, Reject):
        return got
    return (got.sensor, got.node, got.gpu, list(got.ts_ns), list(got.value), got.clock, got.labels, got.span)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), max_size=8), st.sampled_from(["power", "power", "gpu_util", "nope"]))
def test_a_poll_decoded_together_gives_what_each_message_gives_alone(raws: list[bytes], sensor: str) -> None:
    """The columnar decode of a poll (numpy checks over all samples at once) against the lone decode, message by
    message: the same batches, the same rejects, whatever the neighbours."""
    together = decode_sample_messages(raws, sensor, LIMITS)
    event(f"{sum(isinstance(g, SampleBatch) for g in together)} of {len(raws)} accepted")
    assert [plain(g) for g in together] == [plain(decode_samples(raw, sensor, LIMITS)) for raw in raws]
    for got in together:
        if isinstance(got, SampleBatch):
            assert min(got.ts_ns) == got.span[0] and max(got.ts_ns) == got.span[1]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), max_size=8), st.sampled_from(["power", "power", "gpu_util", "nope"]))
@example([b'{"v":1,"node":3,"gpu":"0","ts_ns":1799913600000000000,"value":0.0,"node":"n9"}'], "power")
def test_the_ingest_block_and_the_rest_give_what_each_message_gives_alone(raws: list[bytes], sensor: str) -> None:
    """``decode_poll`` (the ingest's form: accepted UTC messages as one block, the rest per message) against the lone
    decode: each message is in exactly one of the two, with the same columns, labels and rejects."""
    block, rest = decode_poll(raws, sensor, LIMITS)
    assert len(block.ts_ns) == len(block.value) == sum(block.lens)
    ends = np.cumsum(block.lens).tolist()
    in_block = {i: (n, g, lab, block.ts_ns[e - k:e].tolist(), block.value[e - k:e].tolist())
                for i, n, g, lab, k, e in zip(block.index, block.nodes, block.gpus, block.labels, block.lens, ends,
                                              strict=True)}
    for i, raw in enumerate(raws):
        alone = decode_samples(raw, sensor, LIMITS)
        if i in in_block:
            assert rest[i] is None and isinstance(alone, SampleBatch) and alone.clock == "utc"
            assert in_block[i] == (alone.node, alone.gpu, alone.labels, list(alone.ts_ns), list(alone.value))
        else:
            # Outside the block: what the lone decode gives, a UTC batch too where only the checked path accepts
            # the message (a repeated key, which msgspec refuses and orjson resolves to the last).
            got = rest[i]
            assert got is not None and plain(got) == plain(alone)


def test_a_poll_without_time_limits_and_with_domain_clocks() -> None:
    """Domain-clock stamps are not held to the UTC limits; without limits no stamp is."""
    old = NOW - 30 * 86_400 * 10**9
    raws = [orjson.dumps({"v": 1, "node": "n", "gpu": "0", "ts_ns": [old], "value": [1.0], "clock": c})
            for c in ("utc", "nvml:n")]
    limited = decode_sample_messages(raws, "power", LIMITS)
    assert isinstance(limited[0], Reject) and limited[0].reason.value == "too_old"
    assert isinstance(limited[1], SampleBatch)
    assert all(isinstance(g, SampleBatch) for g in decode_sample_messages(raws, "power", None))


def test_a_stamp_beyond_int64_leaves_its_neighbours_on_the_fast_path() -> None:
    """msgspec reads stamps up to 2**64 - 1; the poll's int64 column cannot hold one beyond 2**63 - 1, so that
    message alone goes to the checked path, which names it, and the others keep their samples."""
    def msg(ts: list[int]) -> bytes:  # by hand: orjson refuses ints beyond 64 bits, not beyond int64
        return b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": %s, "value": %s}' % (
            str(ts).encode(), str([1.0] * len(ts)).encode())

    raws = [msg([NOW, NOW + 1]), msg([NOW, 2**63]), msg([NOW + 2]), msg([NOW, 2**64 - 1])]
    got = decode_sample_messages(raws, "power", None)
    assert [plain(g) for g in got] == [plain(decode_samples(raw, "power", None)) for raw in raws]
    assert [type(g).__name__ for g in got] == ["SampleBatch", "Reject", "SampleBatch", "Reject"]
    assert got[2].ts_ns.tolist() == [NOW + 2]  # type: ignore[union-attr]
