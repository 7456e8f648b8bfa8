"""Is a real index-less nvidia-smi recording read exactly, per GPU-second?

    python deploy/bench/nvsmi_exact.py FILE.csv [--gpus N] [--tz UTC]

Reads FILE as ``flopwatch replay`` does (``streams.formats.nvsmi_csv``: N from the rhythm and the
values, or ``--gpus``) and compares, for every GPU and second, the count and mean of ``power.draw``
with the recording's own: nvidia-smi writes GPU 0..N-1 in turn, so data row i after a header is GPU
i mod N, with N the number of rows per loop iteration the file states by its stamps (the caller
checks it, or gives it with ``--truth-gpus``). Prints the reader's note and one JSON line. For
recordings we may not redistribute: the figures go in the docs, the file stays where it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.formats.nvsmi_csv import CsvFormatError, GpuRow, NvsmiCsvReader, Problem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--gpus", type=int, default=None, help="state N to the reader (default: it finds N)")
    ap.add_argument("--truth-gpus", type=int, required=True, help="N the recording was made with")
    ap.add_argument("--tz", default="UTC")
    a = ap.parse_args()
    lines = a.file.read_text(encoding="utf-8").splitlines()
    try:
        out = list(NvsmiCsvReader(a.file.name, ZoneInfo(a.tz), gpus=a.gpus).read(lines))
    except CsvFormatError as exc:
        print(json.dumps({"bench": "nvsmi_exact", "file": a.file.name, "refused": str(exc)}))
        return
    for p in out:
        if isinstance(p, Problem) and "no index or uuid column" in p.what:
            print(p.what, file=sys.stderr)
    want: dict[tuple[str, str], list[float]] = defaultdict(list)
    row = 0
    for line in lines[1:]:
        cells = line.split(", ")
        if cells[0] == "timestamp":
            row = 0
            continue
        if len(cells) >= 2 and cells[1].endswith(" W"):
            want[(str(row % a.truth_gpus), cells[0][:19])].append(float(cells[1].removesuffix(" W")))
        row += 1
    got: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in out:
        if isinstance(r, GpuRow) and "power" in dict(r.values):
            got[(r.gpu, lines[r.line - 1].split(", ")[0][:19])].append(dict(r.values)["power"])
    exact = sum(1 for k, v in want.items() if len(got.get(k, [])) == len(v)
                and abs(sum(got[k]) / len(got[k]) - sum(v) / len(v)) < 1e-9)
    print(json.dumps({"bench": "nvsmi_exact", "file": a.file.name, "rows": len(lines) - 1,
                      "gpu_seconds": len(want), "exact": exact, "extra_gpu_seconds": len(got.keys() - want.keys())}))


if __name__ == "__main__":
    main()
