"""flopwatch's worker against an outside peer on the same messages in the same run: a Quix Streams 3.28
application (``deploy/bench/quix_app.py``) that only decodes, validates and sums samples into 1 s cells in its
RocksDB state, while flopwatch's default worker decodes, validates, aligns 23 streams on the grid, derives,
runs the spike engine, writes frames to ClickHouse and publishes them to Kafka.

    python deploy/bench/quix_peer.py [--samples 1000000] [--rounds 3]

Publishes the batched case of ``throughput.py`` once (the 8 x 8 cluster, 100 samples a message), then
alternates the two, each from the earliest offset with a fresh group. Quix Streams runs from ``.venv-quix``
(made on first use: ``python -m venv .venv-quix && .venv-quix/bin/pip install quixstreams==3.28.1``), so it
stays out of flopwatch's dependencies. Needs a Kafka broker (FLOPWATCH_KAFKA_BOOTSTRAP, default
127.0.0.1:9092). Prints one JSON object; docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy" / "bench"))

from throughput import full_path, publish  # noqa: E402

from agents.kafka.admin import delete_topics, ensure_topics  # noqa: E402
from agents.kafka.topics import Topics  # noqa: E402
from agents.runtime.gc_tuning import tune_for_throughput  # noqa: E402
from agents.settings import Settings, load_settings  # noqa: E402

QUIX_VENV = ROOT / ".venv-quix"
QUIX_VERSION = "3.28.1"


def quix_python() -> Path:
    py = QUIX_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", f"quixstreams=={QUIX_VERSION}"], check=True)
    return py


def quix_round(settings: Settings, samples: int, group: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state:
        out = subprocess.run([str(quix_python()), str(ROOT / "deploy" / "bench" / "quix_app.py"),
                              settings.kafka_bootstrap, group, state, str(samples),
                              *Topics(settings.topic_prefix).sensors],
                             check=True, capture_output=True, text=True, timeout=1800)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tune_for_throughput()
    quix_python()  # made before anything is timed
    tag = uuid.uuid4().hex[:6]
    settings = load_settings(topic_prefix=f"quix{tag}.", source_idle_s=0.5)
    ensure_topics(settings)
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    try:
        pub = publish(settings, args.samples, 100)
        for r in range(args.rounds):
            theirs.append(quix_round(settings, pub["samples"], f"quix{tag}-{r}"))
            with tempfile.TemporaryDirectory() as tmp:
                run = settings.replace(group_id=f"fw{tag}-{r}", chdb_path=f"{tmp}/chdb")
                ours.append(asyncio.run(full_path(run, pub["samples"], False)))
    finally:
        delete_topics(settings)
    for o, t in zip(ours, theirs, strict=True):
        assert o["samples"] == t["samples"] == pub["samples"] and not o["rejects"] and not t["rejected"], (o, t)
    ratios = [t["seconds"] / o["seconds"] for o, t in zip(ours, theirs, strict=True)]
    print(json.dumps({
        "messages": pub["messages"], "samples": pub["samples"], "rounds": args.rounds,
        "quix_streams": QUIX_VERSION,
        "quix_samples_per_s": round(pub["samples"] / statistics.median(t["seconds"] for t in theirs)),
        "flopwatch_samples_per_s": round(pub["samples"] / statistics.median(o["seconds"] for o in ours)),
        "flopwatch_over_quix": round(statistics.median(ratios), 2),
        "per_round": [round(x, 2) for x in ratios],
    }, indent=2))


if __name__ == "__main__":
    main()
