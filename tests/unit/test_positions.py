"""The quiet clock of a sensor partition runs only while Kafka confirms it caught up."""

from __future__ import annotations

from aiokafka import TopicPartition

from agents.ingest.positions import ANSWER_S, TURN_CREDIT_S, Positions

S = 1_000_000_000


class _Fetches:
    """What the consumer's fetcher last said per partition: highwater and when (wall ms)."""

    def __init__(self) -> None:
        self.hw: dict[TopicPartition, int] = {}
        self.at_ms: dict[TopicPartition, float] = {}
        self.paused_tps: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.hw)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.hw.get(tp)

    def last_poll_timestamp(self, tp: TopicPartition) -> float | None:
        return self.at_ms.get(tp)

    def paused(self) -> set[TopicPartition]:
        return self.paused_tps


def test_quiet_clock_counts_only_confirmed_caught_up_time() -> None:
    clock = {"mono": 0, "wall": 1_000 * S}
    pos = Positions(mono_ns=lambda: clock["mono"], wall_ns=lambda: clock["wall"])
    a, b = TopicPartition("sensors.power", 0), TopicPartition("sensors.gpu_util", 0)
    kafka = _Fetches()
    pos.assigned([a, b])
    pos.read(a, 9)  # a: read up to offset 9 of 10 records
    pos.read(b, 4)  # b: 5 of 8
    kafka.hw = {a: 10, b: 8}

    def turn(dt_s: float, answered: bool = True) -> None:
        clock["mono"] += int(dt_s * S)
        clock["wall"] += int(dt_s * S)
        if answered:
            kafka.at_ms = {tp: clock["wall"] / 1e6 for tp in kafka.hw}
        pos.tick_quiet(kafka)

    for _ in range(5):  # the turns of a worker keeping up count in full
        turn(0.1)
    assert pos.quiet == {a: S // 2, b: 0}  # b has unread records: its clock stands
    for _ in range(10):  # the broker is gone: no fetch responses, no quiet time
        turn(0.2, answered=False)
    assert pos.quiet[a] == S // 2 + int(ANSWER_S * S)  # responses up to ANSWER_S old still count
    turn(30.0)  # a stalled loop counts for at most one turn's credit
    assert pos.quiet[a] == S // 2 + int(ANSWER_S * S) + int(TURN_CREDIT_S * S)
    assert pos.lag(kafka) == 3 and pos.unread(kafka) == {b}
    kafka.paused_tps = {a}  # reading paused (ClickHouse away): its last answer no longer confirms anything
    turn(0.1)
    assert pos.quiet[a] == S // 2 + int(ANSWER_S * S) + int(TURN_CREDIT_S * S)
    kafka.paused_tps = set()
    pos.revoked([a])
    assert a not in pos.quiet and pos.position(a) is None


def test_a_slow_turn_counts_as_one_turns_credit_of_quiet() -> None:
    """During a turn the fetcher cannot run, so records may wait in Kafka unseen: a turn of 1.5 s after a fresh
    answer is not 1.5 s of confirmed quiet, and under a 1 s idle bound it made a stream that lagged idle."""
    clock = {"mono": 0, "wall": 1_000 * S}
    pos = Positions(mono_ns=lambda: clock["mono"], wall_ns=lambda: clock["wall"])
    a = TopicPartition("sensors.power", 0)
    kafka = _Fetches()
    pos.assigned([a])
    pos.read(a, 9)
    kafka.hw = {a: 10}
    kafka.at_ms = {a: clock["wall"] / 1e6}  # caught up at the turn's start
    clock["mono"] += int(1.5 * S)
    clock["wall"] += int(1.5 * S)
    pos.tick_quiet(kafka)
    assert 0 < pos.quiet[a] == int(TURN_CREDIT_S * S) < S


def test_lag_and_unread_while_an_end_or_a_position_is_not_known() -> None:
    pos, kafka = Positions(), _Fetches()
    a, b, c = (TopicPartition("sensors.power", p) for p in range(3))
    pos.assigned([a, b, c])
    kafka.hw = {a: 5, b: 7, c: 0}
    pos.read(a, 4)  # a read to its end; b's position not known yet; c empty, its position not known either
    assert pos.lag(kafka) is None and pos.unread(kafka) == {b, c}
    pos.read(b, 6)
    pos._probed[c] = 0  # what probe() learns from Kafka for a partition not read from yet
    assert pos.lag(kafka) == 0 and pos.unread(kafka) == set()
    kafka.hw[a] = 9  # more records came
    assert pos.lag(kafka) == 4 and pos.unread(kafka) == {a}
