"""Tables of where a process's time goes, from py-spy's raw (collapsed-stack) output.

    python deploy/bench/stacks.py STACKS.txt OUT.txt [--rate 250]

Self time by function (line numbers kept: a hot line is what the next change reads), then inclusive time
by function (line numbers dropped: a function's whole share), each as a percentage of all active samples.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path


def summarize(stacks: Path, out: Path, rate: int, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames if not f.startswith(("thread (", "process "))}:
            incl[f] += k
    lines = [f"# samples: {total} (py-spy --rate {rate}, active threads); self time by function"]
    lines += [f"{100 * k / total:5.1f}%  {fn}" for fn, k in own.most_common(top)]
    lines += ["", "# inclusive time by function"]
    lines += [f"{100 * k / total:5.1f}%  {fn}" for fn, k in incl.most_common(2 * top)]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stacks", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rate", type=int, default=250)
    args = ap.parse_args()
    print(summarize(args.stacks, args.out, args.rate), end="")


if __name__ == "__main__":
    main()
