#!/usr/bin/env bash
# What the consistency check costs across nodes (#19): smddp-perf allreduce (or --coll) of 8 B
# and 4 MiB over 2 namespace hosts x L ranks, rounds alternating SMDDP_CHECK_CONSISTENCY=1 and
# =0; prints each setting's median and quartiles over the rounds. Run as root, after
# `cmake --build build/host`:
#   benchmarks/consistency_cost_hosts.sh [--rounds 9] [--per-host 1] [--coll allreduce]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=9 per_host=1 coll=allreduce perf=build/host/benchmarks/smddp-perf
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x $perf ] || { echo "build smddp-perf first (cmake --build build/host)" >&2; exit 1; }
id=$(tools/netns up 2)
work=$(mktemp -d)
trap 'tools/netns down $id; rm -rf "$work"' EXIT
world=$((2 * per_host))
for r in $(seq "$rounds"); do
  for check in 1 0; do
    for size in "-b 8 -e 8 -w 200 -n 2000" "-b 4M -e 4M -w 3 -n 20"; do
      store=$(mktemp -d -p "$work")
      pids=()
      for ((k = 0; k < world; k++)); do
        h=$((k / per_host))
        tools/netns exec "$id" $h -- env RANK=$k WORLD_SIZE=$world SMDDP_NODE_ID=host$h SMDDP_PERF_STORE="$store" \
          SMDDP_CHECK_CONSISTENCY=$check FI_TCP_IFACE=eth0 $perf -c "$coll" $size >"$store/out$k" 2>&1 &
        pids+=($!)
      done
      for ((k = 0; k < world; k++)); do  # a rank that failed, or found #wrong, ends the measurement
        wait "${pids[$k]}" || { echo "consistency_cost_hosts: rank $k failed:" >&2; tail -20 "$store/out$k" >&2; exit 1; }
      done
      awk -v c=$check '/^ +[0-9]/ { print c, $1, $6 }' "$store/out0" >>"$work/times"
    done
  done
done
python3 - "$work/times" "$coll" "$per_host" "$rounds" <<'PY'
import statistics, sys
path, coll, per_host, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
t = {}
for line in open(path):
    check, size, us = line.split()
    t.setdefault((int(size), check), []).append(float(us))
print(f"{coll}, 2 namespace hosts x {per_host} rank(s), {rounds} alternating rounds; µs: lower quartile / median / upper quartile")
print("| size | check on | check off | on / off (medians) |")
print("| --- | --- | --- | --- |")
for size in sorted({s for s, _ in t}):
    q = {c: statistics.quantiles(t[(size, c)], n=4) if len(t[(size, c)]) > 1 else [t[(size, c)][0]] * 3 for c in "10"}
    fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)
    label = f"{size} B" if size < 1024 else f"{size >> 20} MiB"
    print(f"| {label} | {fmt(q['1'])} | {fmt(q['0'])} | {q['1'][1] / q['0'][1]:.2f} |")
PY
