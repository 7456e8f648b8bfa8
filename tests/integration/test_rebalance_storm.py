"""Issue 22 §2: several workers coming and going. Three workers share one group on a 12-partition topic set
while the collectors produce; every 20 s one of them is SIGKILLed or SIGTERMed and another starts. The frames
in ClickHouse are exact at the end, and each rebalance's catch-up time is measured.

CI runs a 100 s storm (five rebalances); ``FLOPWATCH_STORM_S=300`` runs the issue's five minutes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import threading
import time
import uuid
from pathlib import Path

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import Settings
from streams.sim.simulate import SimParams
from tests.integration.helpers import Worker, assert_frames_equal, expected_frames, stored_frames

S = 1_000_000_000
STORM_S = float(os.environ.get("FLOPWATCH_STORM_S", "100"))
EVERY_S = 20.0
CAUGHT_UP = 200  # records behind the end, summed over the live workers: what one poll of the feed leaves


def test_a_rebalance_storm_of_three_workers_loses_and_doubles_nothing(native_settings: Settings,
                                                                     tmp_path: Path) -> None:
    settings = native_settings.replace(topic_prefix=f"storm{uuid.uuid4().hex[:6]}.", partitions=12,
                                       flush_interval_ms=300, source_idle_s=2.0)
    ensure_topics(settings)
    duration = STORM_S + 25.0
    # Twelve nodes keyed over twelve partitions: each worker of three owns some of them at any time.
    params = SimParams(nodes=12, gpus=2, seed=22, start_ns=(time.time_ns() // S - 15) * S)
    pub = SimulatorPublisher(settings, params, batch_size=10)
    want = expected_frames(params, duration)
    rng = random.Random(22)
    done = threading.Event()

    def produce() -> None:  # one second of event time per second, about 15 s behind the wall clock
        t0 = time.monotonic()
        for k in range(int(duration)):
            pub.backlog(1.0, 1.0)
            time.sleep(max(0.0, t0 + k + 1 - time.monotonic()))
        done.set()

    producing = threading.Thread(target=produce, daemon=True)
    workers = [Worker(settings) for _ in range(3)]
    gone: list[tuple[Worker, str]] = []
    catch_up: list[tuple[str, float]] = []
    try:
        for w in workers:
            w.wait_for_log("assigned partitions [")
        producing.start()
        next_at = time.monotonic() + EVERY_S
        for k in range(int(STORM_S // EVERY_S)):
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += EVERY_S
            victim = workers.pop(rng.randrange(len(workers)))
            how = "SIGKILL" if k % 2 == 0 else "SIGTERM"
            victim.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
            gone.append((victim, how))
            hit = time.monotonic()
            workers.append(Worker(settings))
            catch_up.append((how, _caught_up_after(workers, hit)))
        producing.join(duration + 60)
        assert done.is_set(), "the producer did not finish"
        deadline = time.monotonic() + 180
        got, nrows = stored_frames(settings)
        while time.monotonic() < deadline:
            got, nrows = stored_frames(settings)
            stats = [w.drain() for w in workers]
            if len(got) >= len(want) and all(st.get("open_cells", 1) == 0 for st in stats):
                break
            time.sleep(1.0)
    finally:
        for w in workers:
            w.proc.kill()
        for w, _ in gone:
            w.proc.kill()
        delete_topics(settings)

    for w, how in gone:  # a SIGTERMed worker commits what it wrote and leaves the group cleanly
        assert w.proc.wait(30) == (0 if how == "SIGTERM" else -signal.SIGKILL), (how, "".join(w.tail)[-3000:])
    assert nrows == len(got), f"{nrows - len(got)} duplicate rows in gpu_frames"
    assert_frames_equal(got, want)
    assert all(st.get("rejects", {}) == {} for st in (w.drain() for w in workers))
    report = {"storm_s": STORM_S, "every_s": EVERY_S, "workers": 3, "partitions": 12, "frames": len(want),
              "catch_up_s": [[how, round(s, 1)] for how, s in catch_up],
              "median_catch_up_s": {h: round(statistics.median(s for x, s in catch_up if x == h), 1)
                                    for h in {x for x, _ in catch_up}}}
    out = Path(os.environ.get("FLOPWATCH_STORM_REPORT", tmp_path / "storm.json"))
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


def _caught_up_after(workers: list[Worker], hit: float, timeout_s: float = 60.0) -> float:
    """Seconds from ``hit`` until every live worker has been assigned partitions since, and together they
    are back within one poll of the end of the input."""
    deadline = hit + timeout_s
    lags: list[int | None] = []
    while time.monotonic() < deadline:
        stats = [w.drain() for w in workers]
        assigned = all(any(t >= hit for t in w.assignments) for w in workers)
        lags = [st.get("lag") for st in stats]
        known = [lag for lag in lags if lag is not None]
        if assigned and len(known) == len(lags) and sum(known) <= CAUGHT_UP:
            return time.monotonic() - hit
        time.sleep(0.2)
    raise AssertionError(f"not caught up {timeout_s:.0f} s after the rebalance: lags {lags}, "
                         f"assigned {[bool(w.assignments) and w.assignments[-1] >= hit for w in workers]}")
