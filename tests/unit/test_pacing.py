"""Reading a backlog in step (``streams.align.pacing``): the rule, and a backlog through the ingest's core."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
from aiokafka import ConsumerRecord, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from agents.ingest.core import IngestCore
from agents.kafka.topics import Topics
from agents.runtime.timebase import ManualClock
from agents.settings import load_settings
from agents.sinks.clickhouse import Backend
from agents.sinks.store import FrameStore, Progress
from schemas.codec import encode_batch
from schemas.records import UTC_CLOCK, SampleBatch
from streams.align.aligner import Recovered
from streams.align.pacing import ahead
from tests.unit.test_core import Letters

S = 1_000_000_000
T0 = 1_796_200_000 * S
TOPICS = Topics("u.")
UTIL, POWER = TopicPartition(TOPICS.sensor(0), 0), TopicPartition(TOPICS.sensor(4), 0)


@given(st.dictionaries(st.integers(0, 9), st.integers(-10**12, 10**12)), st.sets(st.integers(0, 9)),
       st.integers(0, 10**10))
def test_only_sources_with_data_ahead_of_the_slowest_are_paused(newest: dict[int, int], unread: set[int],
                                                                lead: int) -> None:
    paused = ahead(newest, unread, lead)
    assert paused <= unread
    if unread:
        assert unread - paused  # one source with data always reads on: a backlog always moves
    if unread and unread <= newest.keys():
        floor = min(newest[k] for k in unread)
        assert paused == {k for k in unread if newest[k] > floor + lead}


def backlog(seconds: int, per_message: int) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    """One GPU's ``seconds`` of power at 1 Hz and gpu_util at 10 Hz, ``per_message`` samples a record."""
    out: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    for tp, sensor, hz in ((POWER, "power", 1), (UTIL, "gpu_util", 10)):
        ts = T0 + np.arange(seconds * hz, dtype=np.int64) * (S // hz)
        out[tp] = []
        for i in range(0, len(ts), per_message):
            piece = ts[i:i + per_message]
            raw = encode_batch(SampleBatch(sensor, "n0", "0", piece.tolist(), [50.0] * len(piece), UTC_CLOCK, {}))
            out[tp].append(ConsumerRecord(tp.topic, 0, len(out[tp]), 0, 0, b"n0", raw, None, 2, len(raw), []))
    return out


def read(records: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
         paced: Callable[[IngestCore, set[TopicPartition]], set[TopicPartition]]) -> tuple[Letters, int, int]:
    """A consumer at its worst: each poll takes up to 5 records of the first partition it may read, power's
    before gpu_util's. Returns the dead letters, the frames and the most samples the core held open."""
    settings = load_settings({}, topic_prefix="u.", partitions=1, lateness_ms=1000, source_idle_s=1.0,
                             max_open_samples=400)
    store, letters = FrameStore(cast(Backend, None)), Letters()
    core = IngestCore(settings, store, letters, ManualClock(wall_ns=T0 + 700 * S, mono_ns=0))
    core.assign([POWER, UTIL], Progress(Recovered()))  # the other topics' hold while silent is not the point here
    at = dict.fromkeys(records, 0)
    quiet = dict.fromkeys(records, 0)
    most_open = 0
    while True:
        unread = {tp for tp in records if at[tp] < len(records[tp])}
        if not unread:
            break
        tp = next(tp for tp in (POWER, UTIL) if tp in unread - paced(core, unread))
        core.handle({tp: records[tp][at[tp]:at[tp] + 5]})
        at[tp] += 5
        for q in quiet.keys() - unread:  # a poll's turn of 100 ms; the quiet clock runs for the one caught up
            quiet[q] += S // 10
        core.advance(quiet)
        most_open = max(most_open, core.open_samples())
    core.advance({q: 60 * S for q in quiet})  # the end: every topic caught up and quiet
    return letters, sum(len(b) for b in store.detach().batches), most_open


def test_a_backlog_read_ahead_makes_samples_late_and_read_in_step_loses_none() -> None:
    records = backlog(600, per_message=10)
    letters, frames, most_open = read(records, lambda core, unread: set())
    assert letters.counts["late"] > 0 and most_open == 400  # power's ten minutes wait open; the bound closes them
    letters, frames, most_open = read(records, IngestCore.paced)
    assert letters.counts == {} and frames == 600 and most_open < 200  # on from 100, one poll of power past it
