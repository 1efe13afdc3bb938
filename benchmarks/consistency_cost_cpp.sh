#!/usr/bin/env bash
# What the consistency check costs through the C++ API at 8 B, one node, w=2: smddp-perf runs
# alternating the check on and off (and, given two builds, alternating the builds too, so both
# see the same background), N rounds each; prints per setting min / lower quartile / median µs,
# and the paired cost: each "on" run beside the "off" run made right after it, counted only when
# both saw the same core-to-core speed (this VM moves its two vCPUs between ~50 ns and ~170 ns
# apart every few seconds, which moves an 8 B time by more than the check costs).
#   benchmarks/consistency_cost_cpp.sh [ROUNDS] [NAME=SMDDP_PERF ...]
# e.g. benchmarks/consistency_cost_cpp.sh 31 before=/tmp/old/smddp-perf after=build/host/benchmarks/smddp-perf
set -euo pipefail
rounds=${1:-31}; shift || true
builds=("$@")
[ ${#builds[@]} -eq 0 ] && builds=("this=build/host/benchmarks/smddp-perf")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 0; i < rounds; i++)); do
  for b in "${builds[@]}"; do
    name=${b%%=*} bin=${b#*=}
    for coll in allreduce allgather reduce_scatter; do
      for chk in 1 0; do
        t=$(SMDDP_CHECK_CONSISTENCY=$chk LD_LIBRARY_PATH=$(dirname "$bin") "$bin" -np 2 -c $coll -b 8 -e 8 -w 500 -n 3000 |
            awk '!/^#/ && NF > 10 { print $6, $11 }')
        echo "$name $coll $chk $i $t" >>"$out"
      done
    done
  done
done
echo "| build | collective | check on: min / q1 / median (µs) | check off: min / q1 / median (µs) | on/off (medians) | pairs at one speed | paired cost: median ns (on/off) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
python3 - "$out" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    b, c, k, i, t, c2c = line.split()
    rows.setdefault((b, c), {}).setdefault(k, {})[int(i)] = (float(t), float(c2c))
def q(v):
    v = sorted(v); return v[0], v[len(v) // 4], statistics.median(v)
def speed(ns):  # the two core-to-core speeds this VM switches between
    return "near" if ns < 100 else "far"
for (b, c), d in rows.items():
    on, off = q(t for t, _ in d["1"].values()), q(t for t, _ in d["0"].values())
    pairs = [(d["1"][i][0], d["0"][i][0]) for i in d["1"] if i in d["0"] and speed(d["1"][i][1]) == speed(d["0"][i][1])]
    diff = statistics.median(1000 * (a - o) for a, o in pairs) if pairs else float("nan")
    ratio = statistics.median(a / o for a, o in pairs) if pairs else float("nan")
    print(f"| {b} | {c} | {on[0]:.2f} / {on[1]:.2f} / {on[2]:.2f} | {off[0]:.2f} / {off[1]:.2f} / {off[2]:.2f} "
          f"| {on[2] / off[2]:.3f} | {len(pairs)} | {diff:+.1f} ({ratio:.3f}) |")
PY
