#!/usr/bin/env python3
"""Two builds of smddp side by side in one sitting (#12's regression guard): runs each build's
smddp-perf in turn, round after round (the order flips every round, so a drift of the machine
during the sitting falls on both), and prints per collective, world size and message size the
median time of each build and their ratio. This machine's two core-to-core speeds
(docs/performance.md) move single runs by 3-5x, so each row also counts the runs whose
core-to-core probe read fast (< 100 ns), and the medians are taken over fast runs where both
builds have some.

    benchmarks/compare_builds.py BASE/smddp-perf NEW/smddp-perf [--rounds 5] [--np 2,4]
        [--colls allreduce,reduce_scatter,allgather] [--min 256K] [--max 64M] [--factor 4]
        [--warmup 5] [--iters 20] [--labels base,new] [--busy] [--in-place] [--launcher CMD]

--busy runs every launch beside one busy process per CPU (smddp-perf -H 1, #18). The worst
columns show the slowest run of each build: a change to how ranks wait shows in the tail first.
--in-place runs the allreduces in place (smddp-perf -i 1), as torch's all_reduce and DDP's buckets
do: out of place, with an input nobody rewrites, the two can rank algorithms differently
(docs/performance.md, "In place, as torch runs it").
--launcher runs each smddp-perf under a command, e.g. "qemu-aarch64 -L /usr/aarch64-linux-gnu"
for a cross-built one (the aarch64 step of tools/test-all).

Prints a markdown table; exits non-zero only if a run fails or reports wrong results (never on
a timing: CI never fails on speed).
"""
import argparse
import shlex
import statistics
import subprocess
import sys

FAST_C2C_NS = 100


def run(perf, coll, np_, a):
    cmd = shlex.split(a.launcher) + [perf, "-np", str(np_), "-c", coll, "-b", a.min, "-e", a.max, "-f", str(a.factor), "-w", str(a.warmup),
           "-n", str(a.iters)] + (["-H", "1"] if a.busy else []) + (["-i", "1"] if a.in_place and coll == "allreduce" else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    if a.in_place and coll == "allreduce" and ", in place" not in p.stdout.partition("\n")[0]:
        sys.exit(f"{' '.join(cmd)}: its header does not say the allreduce ran in place")
    rows = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        # size count type redop root time algbw busbw wrong algorithm c2c
        if int(f[8]) != 0:
            sys.exit(f"{' '.join(cmd)}: {f[8]} wrong results at {f[0]} B")
        rows[int(f[0])] = (float(f[5]), float(f[10]), f[9])
    return rows


def human(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--colls", default="allreduce,reduce_scatter,allgather")
    ap.add_argument("--min", default="256K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--labels", default="base,new")
    ap.add_argument("--busy", action="store_true", help="beside one busy process per CPU (smddp-perf -H 1)")
    ap.add_argument("--launcher", default="", help="a command to run each smddp-perf under (an emulator)")
    ap.add_argument("--in-place", action="store_true",
                    help="allreduce in place, as torch and DDP run it (smddp-perf -i 1; both builds need it)")
    a = ap.parse_args()
    labels = a.labels.split(",")
    perfs = [a.base, a.new]
    # results[(coll, np, size)][build] = [(time_us, c2c_ns), ...]
    results = {}
    algos = {}
    for rnd in range(a.rounds):
        order = [0, 1] if rnd % 2 == 0 else [1, 0]
        for coll in a.colls.split(","):
            for np_ in (int(x) for x in a.np.split(",")):
                for b in order:
                    for size, (t, c2c, algo) in run(perfs[b], coll, np_, a).items():
                        results.setdefault((coll, np_, size), ([], []))[b].append((t, c2c))
                        algos[(coll, np_, size, b)] = algo
        print(f"# round {rnd + 1} of {a.rounds} done", file=sys.stderr, flush=True)

    print(f"| collective | w | size | {labels[0]} (µs) | {labels[1]} (µs) | {labels[1]} / {labels[0]} "
          f"| worst {labels[0]} (µs) | worst {labels[1]} (µs) | fast runs ({labels[0]}, {labels[1]}) | algorithm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (coll, np_, size), runs in sorted(results.items()):
        fast = [[t for t, c in r if c < FAST_C2C_NS] for r in runs]
        use = fast if all(fast) else [[t for t, _ in r] for r in runs]
        med = [statistics.median(u) for u in use]
        worst = [max(t for t, _ in r) for r in runs]
        print(f"| {coll} | {np_} | {human(size)} | {med[0]:.1f} | {med[1]:.1f} | {med[1] / med[0]:.3f} "
              f"| {worst[0]:.1f} | {worst[1]:.1f} "
              f"| {len(fast[0])}/{len(runs[0])}, {len(fast[1])}/{len(runs[1])}{'' if all(fast) else ' (all runs)'} "
              f"| {algos[(coll, np_, size, 0)]} / {algos[(coll, np_, size, 1)]} |")


if __name__ == "__main__":
    main()
