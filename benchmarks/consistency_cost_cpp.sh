#!/usr/bin/env bash
# What the consistency check costs through the C++ API at 8 B, one node, w=2: smddp-perf runs
# alternating the check on and off (and, given two builds, alternating the builds too, so both
# see the same background), N rounds each; prints per setting min / lower quartile / median µs.
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
            awk '!/^#/ && NF > 5 { print $6 }')
        echo "$name $coll $chk $t" >>"$out"
      done
    done
  done
done
echo "| build | collective | check on: min / q1 / median (µs) | check off: min / q1 / median (µs) | on/off (medians) |"
echo "| --- | --- | --- | --- | --- |"
python3 - "$out" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    b, c, k, t = line.split()
    rows.setdefault((b, c), {}).setdefault(k, []).append(float(t))
def q(v):
    v = sorted(v); return v[0], v[len(v) // 4], statistics.median(v)
for (b, c), d in rows.items():
    on, off = q(d["1"]), q(d["0"])
    print(f"| {b} | {c} | {on[0]:.2f} / {on[1]:.2f} / {on[2]:.2f} | {off[0]:.2f} / {off[1]:.2f} / {off[2]:.2f} | {on[2] / off[2]:.3f} |")
PY
