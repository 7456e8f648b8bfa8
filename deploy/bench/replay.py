"""Replaying a 50,000-row nvidia-smi CSV at full speed into Kafka, and the frames it gives.

    python deploy/bench/replay.py [--gpus 8] [--ticks 6250] [--period-ms 100] [--batch-size 100]
                                  [--rounds 3] [--no-frames]

Writes a CSV as ``nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,memory.used,
power.draw,temperature.gpu,clocks.sm --format=csv -lms 100`` would (GPUS x TICKS rows, units in
header and values, a few [N/A] and [Not Supported] cells), ending a minute ago; times
``agents.collect.replay.replay`` publishing it (the bar: under 10 s), ``--rounds`` times on fresh topics;
then (unless --no-frames) runs ``flopwatch worker --exit-when-idle`` on the last round and checks
that gpu_frames holds exactly the frames the file implies (count, and every cell equal to the
oracle over the parsed rows).

Needs a Kafka broker (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.collect.replay import replay
from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import Settings, load_settings
from schemas.catalog import BY_NAME
from streams.formats.nvsmi_csv import GpuRow, NvsmiCsvReader
from tests.integration.helpers import assert_frames_equal, run_worker_until_idle, stored_frames
from tests.oracle import Series, oracle

HEADER = ("timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], power.draw [W], "
          "temperature.gpu, clocks.sm [MHz]")


def write_csv(path: Path, gpus: int, ticks: int, period_ms: int) -> None:
    start_ms = (time.time_ns() // 1_000_000 - 60_000 - ticks * period_ms) // 1000 * 1000
    lines = [HEADER]
    for t in range(ticks):
        stamp = datetime.fromtimestamp((start_ms + t * period_ms) / 1000, UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for g in range(gpus):
            util = "[N/A]" if (t * 7 + g) % 997 == 0 else f"{(t * 37 + g * 11) % 101} %"
            clock = "[Not Supported]" if (t + g) % 1999 == 0 else f"{1410 + 15 * ((t + 3 * g) % 40)} MHz"
            lines.append(f"{stamp}, {g}, GPU-{g:08x}-0000-4000-8000-00000000bench, NVIDIA H100 80GB HBM3, {util}, "
                         f"{1024 + (t * 17) % 80000} MiB, {150 + ((t * 13 + g * 7) % 550) * 0.75:.2f} W, "
                         f"{40 + (t + g) % 45}, {clock}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def expected(path: Path, node: str) -> dict[Series, list[tuple[int, float]]]:
    series: dict[Series, list[tuple[int, float]]] = {}
    with path.open(encoding="utf-8") as f:
        for row in NvsmiCsvReader(str(path), ZoneInfo("UTC")).read(f):
            if isinstance(row, GpuRow):
                for sensor, v in row.values:
                    series.setdefault((node, row.gpu, BY_NAME[sensor].index), []).append((row.ts_ns, v))
    return series


def fresh(base: Settings, tmp: Path) -> Settings:
    tag = uuid.uuid4().hex[:8]
    s = base.replace(topic_prefix=f"bench{tag}.", group_id=f"bench{tag}", chdb_path=str(tmp / f"chdb-{tag}"),
                     clickhouse_database=f"bench_{tag}", source_idle_s=1.0, web_enabled=False)
    ensure_topics(s)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=6250)
    ap.add_argument("--period-ms", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-frames", action="store_true", help="Skip the worker run and the frame check.")
    args = ap.parse_args()
    base = load_settings()
    out: dict[str, object] = {"rows": args.gpus * args.ticks, "gpus": args.gpus, "ticks": args.ticks,
                              "batch_size": args.batch_size}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        csv = tmp / "bench-node.csv"
        write_csv(csv, args.gpus, args.ticks, args.period_ms)
        out["file_mib"] = round(csv.stat().st_size / 2**20, 2)
        times, used = [], []
        settings = base
        for r in range(args.rounds):
            settings = fresh(base, tmp)
            t0 = time.perf_counter()
            result = replay(settings, [csv], batch_size=args.batch_size)  # includes the final flush: all acked
            times.append(time.perf_counter() - t0)
            d = result.as_dict()
            out.update(samples=d["samples"], messages=d["messages"], skipped_cells=d["skipped_cells"],
                       malformed_lines=d["malformed_lines"])
            if r < args.rounds - 1 or args.no_frames:
                used.append(settings)
        out["replay_s"] = [round(t, 3) for t in times]
        out["replay_s_median"] = round(statistics.median(times), 3)
        out["rows_per_s"] = round(args.gpus * args.ticks / statistics.median(times))
        out["bar_under_10_s"] = max(times) < 10.0
        if not args.no_frames:
            t0 = time.perf_counter()
            stats = run_worker_until_idle(settings, timeout_s=600)
            out["worker_s"] = round(time.perf_counter() - t0, 1)
            out["worker_rejected"] = stats.get("rejected", stats.get("rejects"))
            want = oracle(expected(csv, csv.stem))
            got, raw_rows = stored_frames(settings)
            out["frames_expected"], out["frames_stored"], out["rows_stored"] = len(want), len(got), raw_rows
            assert_frames_equal(got, want)
            out["frames_exact"] = raw_rows == len(want)
            used.append(settings)
        for s in used:
            delete_topics(s)
    print(orjson.dumps(out).decode())


if __name__ == "__main__":
    main()
