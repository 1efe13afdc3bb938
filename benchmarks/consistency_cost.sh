#!/usr/bin/env bash
# What the always-on consistency check costs (#19): 8 B and 4 MiB allreduce, allgather and
# reduce_scatter through torch.distributed, w=2 on one node, with SMDDP_CHECK_CONSISTENCY=1
# (default), =0, and torch's own TORCH_DISTRIBUTED_DEBUG=DETAIL check (on top of the default).
# Rounds alternate the three settings; the table shows each setting's median over the rounds.
# Run inside the trixie devenv with the extension built:
#   tools/devenv run -- env PYTHONPATH=build/trixie/python benchmarks/consistency_cost.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
settings=("check SMDDP_CHECK_CONSISTENCY=1" "nocheck SMDDP_CHECK_CONSISTENCY=0" "detail SMDDP_CHECK_CONSISTENCY=1 TORCH_DISTRIBUTED_DEBUG=DETAIL")
for r in $(seq "$ROUNDS"); do
  for s in "${settings[@]}"; do
    read -r name vars <<<"$s"
    env $vars python3 benchmarks/torch_collectives.py --np 2 --backends smddp --ops allreduce,allgather,reduce_scatter \
      --min 8 --max 4M --factor 524288 --iters 300 --warmup 20 --out "$out/$name-$r" >/dev/null 2>&1
  done
done
python3 - "$out" "$ROUNDS" <<'PY'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
t = {}
for name in ("check", "nocheck", "detail"):
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/{name}-{r}/results.csv")):
            t.setdefault((row["op"], int(row["bytes"]), name), []).append(float(row["time_us"]))
print(f"| collective | size | check on (µs) | check off (µs) | on / off | torch DETAIL (µs) | DETAIL / off |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for op in ("allreduce", "allgather", "reduce_scatter"):
    for size in (8, 4 << 20):
        on, off, det = (statistics.median(t[(op, size, n)]) for n in ("check", "nocheck", "detail"))
        label = "8 B" if size == 8 else "4 MiB"
        print(f"| {op} | {label} | {on:.1f} | {off:.1f} | {on / off:.3f} | {det:.1f} | {det / off:.2f} |")
PY
