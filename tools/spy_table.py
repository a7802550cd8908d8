#!/usr/bin/env python3
"""Tables of a py-spy raw profile (``py-spy record -f raw``, plain or gzipped), restricted to the samples
under one Python function (``--under spin``: the decode steps of ``host_probe.py --spin``).

    python tools/spy_table.py r/spy-native.txt.gz --by function     # inclusive share per Python function
    python tools/spy_table.py r/spy-native.txt.gz --by library      # self share per leaf library (native)
    python tools/spy_table.py r/spy-native.txt.gz --by frames --inside mm_dense   # native frames under a function

Shares are of the samples under ``--under``; with ``--native`` sampling (py-spy pauses the process at each
sample) they are shares of host time, the device being ahead of the paused host.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re


def _stacks(path: str, under: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            idx = [k for k, fr in enumerate(frames) if fr.startswith(f"{under} (")]
            if idx:
                yield frames[idx[-1] + 1 :], int(n)


def _short(frame: str) -> str:
    name = frame.split(" (")[0]
    for _ in range(4):
        name = re.sub(r"<[^<>]*>", "", name)
    return name[-80:]


def _python(frame: str) -> str | None:
    m = re.match(r"(.*) \((.*?)(:\d+)?\)$", frame)
    if m and (".py" in m.group(2) or m.group(2).startswith("<tokenspeed")):
        return f"{m.group(1)} [{m.group(2).split('/')[-1]}]"
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("raw")
    p.add_argument("--under", default="spin")
    p.add_argument("--by", choices=("function", "library", "frames"), default="function")
    p.add_argument("--inside", default=None, help="--by frames: only the samples under this function name")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    total, counts = 0, collections.Counter()
    for frames, n in _stacks(args.raw, args.under):
        total += n
        if args.by == "function":
            for name in {x for x in map(_python, frames) if x}:
                counts[name] += n
        elif args.by == "library":
            leaf = frames[-1] if frames else "<under itself>"
            m = re.search(r"\(([^()]*)\)$", leaf)
            where = m.group(1) if m else "?"
            where = "python " + where.split(":")[0].split("/")[-1] if ".py" in where else where
            counts[re.sub(r"\.so[.0-9]*$", ".so", where)] += n
        else:
            pos = [k for k, fr in enumerate(frames) if args.inside and fr.startswith(f"{args.inside} (")]
            if args.inside and not pos:
                continue
            for name in {_short(fr) for fr in frames[(pos[-1] + 1) if pos else 0 :]}:
                counts[name] += n
    print(f"{total} samples under {args.under}")
    for name, n in counts.most_common(args.top):
        print(f"{100 * n / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
