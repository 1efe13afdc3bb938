#!/bin/bash
# window bands (auto) vs staged everywhere (off), default selection, auto stores
P=${P:-build/host/benchmarks/smddp-perf}  # from the repository root
for round in 1 2 3; do
  for c in allreduce reduce_scatter allgather; do
    extra=""; [ $c = allreduce ] && extra="-i 1"
    for hw in auto off; do
      echo "## round $round $c window=$hw"
      SMDDP_HOST_WINDOW=$hw $P -np 2 -c $c -b 256K -e 64M -f 4 -n 100 $extra 2>&1 | grep -v "^#" | awk '{printf "%s %s %s %s\n", $1/1024, $6, $(NF-1), $NF}'
    done
  done
done
