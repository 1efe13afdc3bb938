#!/usr/bin/env bash
# Regenerates every table and plot of docs/performance.md (run as root on the host):
#   benchmarks/run_all.sh [OUT]      (default OUT=docs/performance)
# 1. smddp-perf (C++, no torch) at w=2 and w=4: allreduce, allgather, reduce_scatter
# 2. torch.distributed sweep, smddp vs gloo vs mpi, w=2 and w=4, with the memcpy ceiling, plus
#    DDP and FSDP training-step times; allreduce again with the cores shared three ways (each
#    point the median of 3 runs per backend, alternating; then smddp and Open MPI at every 4x)
# 3. the link ceiling: iperf3 between two namespace hosts, unshaped and capped at 10 Gbit/s
# 4. smddp-perf across 2 namespace hosts x 2 ranks (libfabric), unshaped and capped
# 5. every target of #12 and #18 beside today's figure from 2-4 (benchmarks/targets.py):
#    OUT/targets.md
# Compare mode (#12's regression guard): this working tree's smddp-perf against a git revision's,
# in one sitting, alternating (benchmarks/compare_builds.py prints the table):
#   benchmarks/run_all.sh --compare REVISION [compare_builds.py options, e.g. --rounds 7 --np 2]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--compare" ]; then
  ref=${2:?usage: benchmarks/run_all.sh --compare REVISION [options]}; shift 2
  dir=build/compare/$(git rev-parse --short "$ref")
  if [ ! -d "$dir/src" ]; then  # the revision's tree, without git metadata
    mkdir -p "$dir/src.partial" && git archive "$ref" | tar -x -C "$dir/src.partial" && mv "$dir/src.partial" "$dir/src"
  fi
  flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMDDP_BUILD_TESTS=OFF -DSMDDP_BUILD_BENCHMARKS=ON -DSMDDP_WITH_CUDA=OFF)
  cmake -S "$dir/src" -B "$dir/build" "${flags[@]}" >/dev/null && cmake --build "$dir/build" --target smddp-perf >/dev/null
  cmake -S . -B build/compare/tree "${flags[@]}" >/dev/null && cmake --build build/compare/tree --target smddp-perf >/dev/null
  exec python3 benchmarks/compare_builds.py "$dir/build/benchmarks/smddp-perf" build/compare/tree/benchmarks/smddp-perf \
    --labels "$ref,this tree" "$@"
fi
OUT=${1:-docs/performance}
mkdir -p "$OUT"
tools/host-deps
cmake -S . -B build/host -G Ninja -DSMDDP_BUILD_BENCHMARKS=ON >/dev/null &&
  cmake --build build/host --target smddp-perf core-to-core >/dev/null  # the probe: torch_collectives.py runs it
tools/devenv create --suite trixie
tools/devenv run -- bash -c "cmake -S . -B build/trixie -G Ninja -DSMDDP_BUILD_PYTHON=ON >/dev/null 2>&1 &&
  cmake --build build/trixie --target smddp_C >/dev/null"

{
  echo "# smddp-perf (C++ API, no torch), $(date -u +%Y-%m-%d), $(nproc) cores"
  for np in 2 4; do
    for c in allreduce allgather reduce_scatter; do
      echo; echo '```'
      build/host/benchmarks/smddp-perf -np $np -c $c -b 8 -e 64M -f 4 -w 5 -n 50
      echo '```'
    done
  done
} >"$OUT/smddp-perf.md"
echo "smddp-perf done"

for np in 2 4; do
  tools/devenv run -- env PYTHONPATH=build/trixie/python python3 benchmarks/torch_collectives.py --np $np \
    --backends smddp,gloo,mpi --ops allreduce,allgather,reduce_scatter,ddp_step,fsdp_step --min 8 --max 64M \
    --factor 4 --memcpy --rounds 3 --row-time 0.2 --out "$OUT/torch_np$np"
done
echo "torch sweeps done"

# 2b. the cores shared (#18): OMP_NUM_THREADS=1, unset, and =1 beside one busy process per core;
# 5 rounds, each backend's modes back to back: #18's ratios are read within a round (targets.py)
for np in 2 4; do
  tools/devenv run -- env PYTHONPATH=build/trixie/python python3 benchmarks/torch_collectives.py --np $np \
    --backends smddp,mpi,gloo --ops allreduce --min 8 --max 64M --factor 32 --contention 1,unset,hog --paired \
    --rounds 5 --row-time 0.2 --out "$OUT/contention_np$np"
  # #18 asks every size: smddp and Open MPI at every 4x (targets.py reads this one for #18)
  tools/devenv run -- env PYTHONPATH=build/trixie/python python3 benchmarks/torch_collectives.py --np $np \
    --backends smddp,mpi --ops allreduce --min 8 --max 64M --factor 4 --contention 1,unset,hog --paired \
    --rounds 5 --row-time 0.2 --out "$OUT/contention_dense_np$np"
done
echo "contention sweeps done"

# 2c. the same with a parallel ATen operation before every collective (torch's pool wakes, as in
# training): smddp as shipped (SMDDP_INTRA_OP_THREADS=auto) and with torch's pool kept (keep)
for np in 2 4; do
  tools/devenv run -- env PYTHONPATH=build/trixie/python python3 benchmarks/torch_collectives.py --np $np \
    --backends smddp,mpi,gloo --ops allreduce --min 8 --max 4M --factor 32 --contention 1,unset --compute 1M --paired \
    --rounds 3 --out "$OUT/compute_np$np"
  tools/devenv run -- env PYTHONPATH=build/trixie/python SMDDP_INTRA_OP_THREADS=keep python3 \
    benchmarks/torch_collectives.py --np $np --backends smddp --ops allreduce --min 8 --max 4M --factor 32 \
    --contention 1,unset --compute 1M --paired --rounds 3 --out "$OUT/compute_np${np}_keep"
done
echo "compute sweeps done"

{
  echo "unshaped:      $(tools/netns iperf --seconds 5)"
  echo "tc 10gbit cap: $(tools/netns iperf --seconds 5 --rate 10gbit)"
} >"$OUT/iperf3.txt"
cat "$OUT/iperf3.txt"

# 4. between hosts: 2 namespace hosts x 2 ranks, beside iperf3, unshaped and capped
benchmarks/netns_scenario.sh "$OUT/netns_unshaped.md"
benchmarks/netns_scenario.sh --rate 10gbit "$OUT/netns_10gbit.md"
benchmarks/netns_scenario.sh --per-host 1 "$OUT/netns_unshaped_1rank.md"

# 5. the targets, from what was just measured
python3 benchmarks/targets.py "$OUT"
