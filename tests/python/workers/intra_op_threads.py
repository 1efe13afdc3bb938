"""torch's intra-op threads before and after init_process_group(backend="smddp") for a rank
whose launcher left OMP_NUM_THREADS unset (argv[1]: "unset") or set it (anything else); argv[2]:
"after", the script sets its own count after import smddp; "4 before", torch has 4 threads before
import smddp, as libgomp gives a machine of 4 cores by default (this one may have a single core).
Prints 'rank R threads BEFORE AFTER' and 'rank R ALL OK', or the error init raised."""
import os
import sys

if sys.argv[1] == "unset":
    # Before torch (libgomp reads it when loaded): torchrun sets it to 1 when missing.
    os.environ.pop("OMP_NUM_THREADS", None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode.endswith(" before"):
    torch.set_num_threads(int(mode.split()[0]))

import smddp  # noqa: E402,F401

rank = int(os.environ["RANK"])
if mode == "after":  # the script's own choice after import smddp: one more than torch's default
    torch.set_num_threads(torch.get_num_threads() + 1)
before = torch.get_num_threads()
try:
    dist.init_process_group(backend="smddp")
except Exception as e:  # noqa: BLE001 - the message is what the test checks
    print(f"rank {rank} init failed: {e}", flush=True)
    sys.exit(0)
after = torch.get_num_threads()
# A subgroup's backend is created the same way, on its members only: it must neither change
# the count again nor wait for a node-mate outside it.
dist.new_group([0])
again = torch.get_num_threads()
t = torch.ones(4)
dist.all_reduce(t)
assert torch.equal(t, torch.full((4,), float(dist.get_world_size())))
print(f"rank {rank} threads {before} {after} {again}", flush=True)
dist.destroy_process_group()
print(f"rank {rank} ALL OK", flush=True)
