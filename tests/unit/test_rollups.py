"""Rollups at 1 min and 1 h give the raw table's answers; a retried block changes no table; on chDB."""

from __future__ import annotations

import math

import pytest

from agents.ingest.simulated import ingest_simulation
from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import ensure_schema
from schemas.rollups import ROLLUPS
from streams.sim.simulate import SimParams

DB = "fwroll"
S = 1_000_000_000
HOUR = 1_796_198_400 * S  # 2026-12-02 08:00 UTC
PARAMS = SimParams(nodes=2, gpus=2, seed=5, start_ns=HOUR - 1_200 * S)
# Per workload and hour: what people ask of the raw table, and the same asked of a rollup.
RAW = ("SELECT toStartOfHour(ts) AS h, workload, count(), sum(ifNull(energy_j, 0)), sum(ifNull(cost_usd, 0)), "
       "avg(gpu_util), max(power), avg(flops_per_watt), countIf(idle = 1 AND pod != '') "
       f"FROM {DB}.gpu_frames GROUP BY h, workload ORDER BY h, workload")
ROLLED = ("SELECT toStartOfHour(ts) AS h, workload, sum(frames), sum(energy_j_sum), sum(cost_usd_sum), avgMerge(gpu_util_avg), "
          "max(power_max), avgMerge(flops_per_watt_avg), sum(idle_frames) FROM {db}.{table} GROUP BY h, workload "
          "ORDER BY h, workload")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> ChdbBackend:
    b = ChdbBackend(tmp_path_factory.mktemp("roll") / "db", DB)
    ensure_schema(b)
    # 40 minutes from 20 minutes before an hour: two hours' buckets, partial at both ends.
    assert ingest_simulation(b, PARAMS, seconds=2_400) > 0
    return b


def _close(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isclose(x, y, rel_tol=1e-9))
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("table", [r.table for r in ROLLUPS])
def test_a_rollup_answers_as_the_raw_table_does(backend: ChdbBackend, table: str) -> None:
    _, raw = backend.rows(RAW)
    _, rolled = backend.rows(ROLLED.format(db=DB, table=table))
    assert len(raw) == len(rolled) == 6, raw  # two hours x (training, serving, the hosts' rows)
    for a, b in zip(raw, rolled, strict=True):
        assert _close(a, b), (a, b)
    train = [r for r in raw if r[1] == "llm-pretrain"]
    assert all(r[3] > 0 and r[4] > 0 and r[7] > 0 for r in train), train  # energy, cost and FLOPS/W were there
    _, ids = backend.rows(f"SELECT count(), uniqExact(node, gpu, ts) FROM {DB}.gpu_frames WHERE gpu != 'host'")
    assert ids[0][0] == ids[0][1] >= 4 * 2_380  # each GPU-second once (the last seconds wait for lateness)


def test_rollup_quantiles_estimate_the_raw_ones(backend: ChdbBackend) -> None:
    _, raw = backend.rows(f"SELECT quantiles(0.5, 0.9, 0.99)(gpu_util) FROM {DB}.gpu_frames")
    _, est = backend.rows(f"SELECT quantilesTDigestMerge(0.5, 0.9, 0.99)(gpu_util_q) FROM {DB}.gpu_rollup_1h")
    for exact, guess in zip(raw[0][0], est[0][0], strict=True):
        assert guess == pytest.approx(exact, abs=2.0), (raw, est)  # utilisation in %: within 2 points


def test_a_replayed_range_changes_no_table(backend: ChdbBackend) -> None:
    def snapshot() -> list[list[tuple[object, ...]]]:
        frames = backend.rows(f"SELECT count(), uniqExact(node, gpu, ts), sum(cityHash64(node, gpu, ts, power)) "
                              f"FROM {DB}.gpu_frames")[1]
        rolled = [backend.rows(f"SELECT count(), sum(frames), round(sum(cost_usd_sum), 9) FROM {DB}.{r.table}")[1]
                  for r in ROLLUPS]
        return [frames, *rolled]

    before = snapshot()
    # The same Kafka range read and written again, as by a worker that crashed after its inserts and before its
    # commits: each block comes with the same token, and the server drops it from the frames and the rollups.
    assert ingest_simulation(backend, PARAMS, seconds=2_400) > 0
    assert snapshot() == before
    assert before[0][0][0] == before[0][0][1]  # count() is uniqExact of the row identity, without FINAL
