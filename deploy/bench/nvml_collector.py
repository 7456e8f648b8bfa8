"""CPU cost of the NVML collector: fraction of one core at 100 ms x 8 GPUs (bar: < 2%).

    python deploy/bench/nvml_collector.py [--gpus 8] [--interval-ms 100] [--seconds 30]
        [--modes noop,sdk,kafka] [--processes 2] [--profile]

The collector runs its real loop (``NvmlCollector.run``) over the pynvml double
(``tests/doubles/fake_pynvml.py``), each GPU with ``--processes`` compute processes
attributed through a fake /proc, beacons once a second. Modes, run one after another
in this process:

- ``noop``: samples go to a sink that drops them (the collector and the double alone);
- ``sdk``: through ``agents.collect.sdk.Publisher`` (validation, batching, JSON encoding) into a
  producer double that discards messages (no Kafka client);
- ``kafka``: through the Publisher into the real Kafka at ``FLOPWATCH_KAFKA_BOOTSTRAP``
  (topics with a unique prefix, deleted afterwards); librdkafka's threads count too.

CPU is ``resource.getrusage(RUSAGE_SELF)`` user + system over the run (all threads),
divided by wall time. With the double, an NVML call costs a Python call; the real
library's calls (ctypes into libnvidia-ml, ioctls to the driver) are not measured here.
``--profile`` prints the top of a cProfile of the ``sdk`` mode. Prints a table and one
JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.collect.nvml import NvmlCollector
from agents.collect.sdk import Publisher
from agents.settings import load_settings
from schemas.records import Labels
from tests.doubles import fake_pynvml as fake
from tests.doubles.fake_pynvml import FakeNvml, ProcessInfo

BAR = 0.02


class NoopSink:
    def send(self, sensor: str, node: str, gpu: str, ts_ns: int, value: float, labels: Labels | None = None,
             clock: str = "utc") -> bool:
        return True

    def beacon(self, node: str, clock: str, domain_ns: int, utc_before_ns: int, utc_after_ns: int) -> bool:
        return True

    def poll(self) -> None:
        pass

    def send_pending(self) -> None:
        pass


class DiscardProducer:
    def __init__(self) -> None:
        self.messages = 0

    def produce(self, topic: str, value: bytes, key: str, on_delivery: Any) -> None:
        self.messages += 1
        on_delivery(None, None)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


def _proc_root(root: Path, gpus: int, per_gpu: int) -> dict[int, list[ProcessInfo]]:
    procs: dict[int, list[ProcessInfo]] = {}
    for g in range(gpus):
        procs[g] = []
        for k in range(per_gpu):
            pid = 1000 + g * 10 + k
            uid = f"{g:08x}-0000-4000-8000-{k:012x}"
            (root / str(pid)).mkdir(parents=True, exist_ok=True)
            (root / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
                f"cri-containerd-{'ab' * 32}.scope\n")
            procs[g].append(ProcessInfo(pid, (k + 1) * 2**30))
    return procs


def run_mode(mode: str, args: argparse.Namespace, root: Path, profile: bool) -> dict[str, Any]:
    gpus = fake.gpus(args.gpus)
    for g, plist in _proc_root(root, args.gpus, args.processes).items():
        gpus[g].processes = plist
    nv = FakeNvml(gpus)
    settings = None
    pub: Publisher | None = None
    if mode == "noop":
        sink: Any = NoopSink()
    elif mode == "sdk":
        sink = pub = Publisher("127.0.0.1:1", producer=DiscardProducer(), max_age_ms=args.linger_ms)
    else:
        from agents.kafka.admin import delete_topics, ensure_topics

        settings = load_settings(topic_prefix=f"bench{uuid.uuid4().hex[:6]}.")
        ensure_topics(settings)
        sink = pub = Publisher(settings, max_age_ms=args.linger_ms)
    collector = NvmlCollector(nv, sink, "bench-node", region="bench", proc_root=root)
    collector.open()
    prof = cProfile.Profile() if profile else None
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    if prof:
        prof.enable()
    stats = collector.run(args.interval_ms / 1000.0, duration_s=args.seconds, stop=threading.Event())
    collector.close()
    if pub is not None:
        pub.flush(30.0)
    if prof:
        prof.disable()
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    wall = w1 - w0
    out: dict[str, Any] = {"mode": mode, "gpus": args.gpus, "interval_ms": args.interval_ms, "wall_s": round(wall, 2),
                           "cpu_user_s": round(user, 3), "cpu_sys_s": round(system, 3),
                           "core_fraction": round((user + system) / wall, 5), "ticks": stats.ticks,
                           "samples": stats.samples, "beacons": stats.beacons}
    if pub is not None:
        st = pub.close(10.0)
        out |= {"messages": st.messages, "delivered": st.delivered, "dropped": st.dropped, "failed": st.failed}
    if settings is not None:
        delete_topics(settings)
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out["profile"] = buf.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--modes", default="noop,sdk,kafka")
    ap.add_argument("--processes", type=int, default=2, help="compute processes per GPU")
    ap.add_argument("--linger-ms", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            results.append(run_mode(mode, args, Path(tmp), args.profile and mode == "sdk"))
    print(f"{'mode':6} {'wall s':>7} {'cpu s':>7} {'core %':>7} {'ticks':>6} {'samples':>8} {'messages':>8}  bar < 2%")
    for r in results:
        cpu = r["cpu_user_s"] + r["cpu_sys_s"]
        print(f"{r['mode']:6} {r['wall_s']:7.2f} {cpu:7.3f} {100 * r['core_fraction']:6.2f}% {r['ticks']:6d} "
              f"{r['samples']:8d} {r.get('messages', 0):8d}  {'ok' if r['core_fraction'] < BAR else 'MISSED'}")
    for r in results:
        if "profile" in r:
            print(r.pop("profile"))
    print(json.dumps({"nvml_collector": results, "host_cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
