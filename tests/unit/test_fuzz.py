"""Fuzzing the consumers: arbitrary bytes never raise out of the ingest, the frame or the trigger decoders.

The ingest must turn every record it cannot use into one dead letter with a reason and go on; the
detection agent and ``flopwatch act`` rely on their decoders raising only their own decode error,
which they dead-letter. Inputs: random bytes, random JSON, and valid messages with one field
replaced by a random JSON value. How many are tried: ``FUZZ_EXAMPLES`` hypothesis examples of up to
``FUZZ_RECORDS`` records each (the closing notes quote it).
"""

from __future__ import annotations

import json

from aiokafka import ConsumerRecord, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import decode_beacon, decode_k8s_event, decode_samples
from schemas.frame_messages import FrameDecodeError, decode_frame_message
from schemas.records import Reject, RejectReason
from schemas.triggers import TriggerDecodeError, decode_trigger
from tests.unit.test_core import T0, TOPICS, make, quiet_all

FUZZ_EXAMPLES = 400
FUZZ_RECORDS = 12

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
SAMPLE = {"v": 1, "node": "n0", "gpu": "0", "ts_ns": T0, "value": 300.0}


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "cut"]))
    if kind == "bytes":
        return draw(st.binary(max_size=120))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()  # the standard library writes big integers too
    doc = dict(SAMPLE)
    doc[draw(st.sampled_from([*SAMPLE, "labels", "ts_ns_list", "extra"]))] = draw(json_values)
    raw = json.dumps(doc).encode()
    return raw if kind == "mutated" else raw[: draw(st.integers(0, len(raw)))]


def usable(topic: str, raw: bytes) -> bool:
    """Whether the topic's decoder accepts the record (the ingest may still refuse it later, e.g. late)."""
    if topic == TOPICS.k8s_events:
        return not isinstance(decode_k8s_event(raw), Reject)
    if topic == TOPICS.clock_sync:
        return not isinstance(decode_beacon(raw), Reject)
    return not isinstance(decode_samples(raw, topic.rsplit(".", 1)[-1]), Reject)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([*TOPICS.inputs]), payloads(), st.binary(max_size=8) | st.none()),
                min_size=1, max_size=FUZZ_RECORDS))
def test_the_ingest_dead_letters_what_it_cannot_use_once_with_a_reason_and_never_raises(
        records: list[tuple[str, bytes, bytes | None]]) -> None:
    core, _, letters, clock = make()
    poll: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    for offset, (topic, raw, key) in enumerate(records):
        poll.setdefault(TopicPartition(topic, 0), []).append(
            ConsumerRecord(topic, 0, offset, 0, 0, key, raw, None, len(key or b""), len(raw), []))
    core.handle(poll)
    clock.advance(30 * 1_000_000_000)
    core.advance(quiet_all(30 * 1_000_000_000))
    core.drain()
    assert core.stats.internal_errors == 0, letters.sent
    assert {reason for reason, _, _ in letters.sent} <= {r.value for r in RejectReason}
    lettered = [(topic, offset) for _, topic, offset in letters.sent]
    refused = {(topic, offset) for offset, (topic, raw, _) in enumerate(records) if not usable(topic, raw)}
    assert refused <= set(lettered)  # every record the decoder refuses is a dead letter...
    assert len([x for x in lettered if x in refused]) == len(refused)  # ...exactly once


@settings(max_examples=FUZZ_EXAMPLES * 5, deadline=None)
@given(payloads())
def test_the_frame_and_trigger_decoders_raise_only_their_decode_errors(raw: bytes) -> None:
    for decode, error in ((decode_frame_message, FrameDecodeError), (decode_trigger, TriggerDecodeError)):
        try:
            decode(raw)
        except error as exc:
            assert str(exc)  # a reason a dead letter can carry
