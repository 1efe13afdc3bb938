#!/usr/bin/env bash
# The between-hosts scenario: 2 network-namespace hosts x L ranks (2), smddp-perf across them over
# libfabric's tcp provider, beside iperf3 on the same kind of link. Run as root:
#   benchmarks/netns_scenario.sh [--rate 10gbit] [--coll allreduce|allgather|reduce_scatter]
#                                [--algo NAME] [--perf PATH] [--sizes "-b 64K -e 64M -f 4"]
#                                [--per-host L] [OUT.md]
# SMDDP_* variables of the caller (SMDDP_OFI_RMA, SMDDP_HIER_SLICE, ...) reach the ranks.
# Builds nothing: needs build/host/benchmarks/smddp-perf (cmake --build build/host), or --perf
# naming another build's (to compare two builds in one sitting).
set -euo pipefail
cd "$(dirname "$0")/.."
rate="" out="" coll=allreduce algo="" perf=build/host/benchmarks/smddp-perf sizes="-b 64K -e 64M -f 4" per_host=2
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -x $perf ] || { echo "build smddp-perf first (cmake --build build/host)" >&2; exit 1; }
iperf=$(tools/netns iperf --seconds 5 ${rate:+--rate $rate})
iperf_bidir=$(tools/netns iperf --seconds 5 --bidir ${rate:+--rate $rate})
id=$(tools/netns up 2 ${rate:+--rate $rate})
store=$(mktemp -d)
logs=$(mktemp -d)
trap 'tools/netns down $id; rm -rf "$store" "$logs"' EXIT
world=$((2 * per_host))
pids=()
for ((r = 0; r < world; r++)); do
  h=$((r / per_host))
  tools/netns exec "$id" $h -- env RANK=$r WORLD_SIZE=$world SMDDP_NODE_ID=host$h SMDDP_PERF_STORE="$store" \
    FI_TCP_IFACE=eth0 $perf -c "$coll" ${algo:+-a $algo} -w 2 -n 5 $sizes >"$logs/$r" 2>&1 &
  pids+=($!)
done
failed=()  # a rank that failed (or found #wrong) fails the scenario, its log shown
for ((r = 0; r < world; r++)); do wait "${pids[$r]}" || failed+=($r); done
for r in "${failed[@]}"; do echo "netns_scenario: rank $r failed:" >&2; tail -20 "$logs/$r" >&2; done
{
  echo "# 2 namespace hosts x $per_host ranks, $coll over libfabric (link: ${rate:-unshaped})"
  echo
  echo "$iperf (same kind of link, same machine, just before)"
  echo
  echo "$iperf_bidir (an allreduce sends as much each way at once)"
  echo
  echo '```'
  cat "$logs/0"
  echo '```'
  echo
  # What each host must send over its link at N=2: allreduce 2(N-1)/N x S = S; allgather
  # (S = output) and reduce_scatter (S = input) (N-1)/N x S = S/2.
  factor=$([ "$coll" = allreduce ] && echo 1 || echo 0.5)
  echo "Per host the hierarchical $coll sends $factor x S over its link (the optimum at N=2), so"
  echo "that over the time is the link rate it achieved:"
  awk -v f="$factor" '/^ +[0-9]/ { printf "  %10d B: %.3f GB/s over the link\n", $1, f * $1 / $6 / 1e3 }' "$logs/0"
} | tee ${out:-/dev/null}
[ ${#failed[@]} -eq 0 ]
