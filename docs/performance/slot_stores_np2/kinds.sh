#!/bin/bash
# SMDDP_SHM_STORES plain / streaming / auto, staged algorithms forced, rounds alternating
P=${P:-build/host/benchmarks/smddp-perf}  # from the repository root
H=${H:-0}
for round in 1 2 3; do
  for c in allreduce reduce_scatter broadcast allgather; do
    a=direct; extra=""; [ $c = allreduce ] && { a=rs_ag; extra="-i 1"; }
    for st in plain streaming auto; do
      echo "## round $round $c $st"
      SMDDP_SHM_STORES=$st $P -np 2 -c $c -b 1M -e 64M -f 4 -n 100 -a $a -H $H $extra 2>&1 | grep -v "^#" | awk '{printf "%s %s %s\n", $1/1024, $6, $NF}'
    done
  done
done
