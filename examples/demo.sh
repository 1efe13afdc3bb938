#!/usr/bin/env bash
# The demo (run by `make demo` inside the trixie devenv): the same 4-process DDP job with
# backend "smddp" and with "gloo", then both throughputs side by side. The two runs train the same
# model on the same data, so their last epochs' losses must agree (up to the rounding of the two
# backends' summation orders): the demo fails otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/${SMDDP_DEMO_BUILD:-build/demo}/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import smddp' || { echo "demo: smddp cannot be imported from $PYTHONPATH (run it through make demo)" >&2; exit 1; }
export OMP_NUM_THREADS=1
NPROC=${NPROC:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for backend in smddp gloo; do
  echo "=== torchrun --nproc_per_node=$NPROC examples/train_ddp.py --backend $backend"
  torchrun --nproc_per_node="$NPROC" examples/train_ddp.py --backend "$backend" --json "$out/$backend.json" "$@" \
    2> >(grep -v -E '^(W|\[W)[0-9]{4}|\*{10}|OMP_NUM_THREADS|^ *$' >&2)
done
python3 - "$out" <<'PY'
import json, sys
r = {b: json.load(open(f"{sys.argv[1]}/{b}.json")) for b in ("smddp", "gloo")}
s, g = r["smddp"]["samples_per_s"], r["gloo"]["samples_per_s"]
print()
print(f"{'backend':<8} {'samples/s':>12}")
print(f"{'smddp':<8} {s:>12,.0f}")
print(f"{'gloo':<8} {g:>12,.0f}")
print(f"smddp / gloo = {s / g:.2f}x  ({r['smddp']['world']} processes, same job, same machine)")
ls, lg = r["smddp"]["loss"], r["gloo"]["loss"]
print(f"last epoch's loss: smddp {ls:.6f}, gloo {lg:.6f}")
if not abs(ls - lg) <= 1e-3 * abs(lg):
    sys.exit(f"demo: smddp trained to another loss than gloo ({ls} against {lg}): its results are wrong")
PY
