"""The SageMaker alias import, the timeout of init_process_group, errors as Python exceptions, and a
/dev/shm without room."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (SageMaker's spelling)
from common import checker

check, done = checker()
mode = sys.argv[1]
if mode == "small_shm":
    # test_package.py starts the ranks in a 1 MiB /dev/shm: setup fails on every rank, at once,
    # saying what /dev/shm lacks and what to change (before, a collective died of SIGBUS).
    t0 = time.time()
    try:
        dist.init_process_group(backend="smddp", timeout=datetime.timedelta(seconds=60))
        check("init_process_group in a 1 MiB /dev/shm raises", False, "it returned")
    except Exception as e:  # noqa: BLE001 (whatever torch wraps it in, the message is what counts)
        msg = str(e)
        check("the error says /dev/shm has no room", "cannot reserve" in msg and "/dev/shm" in msg, msg)
        check("the error names the settings and the fix", "SMDDP_SHM_CHUNK" in msg and "--shm-size" in msg, msg)
        check("it comes at once, not at the 60 s timeout", time.time() - t0 < 30, f"{time.time() - t0:.1f} s")
    done()
    sys.exit(0)
dist.init_process_group(backend="smddp", timeout=datetime.timedelta(seconds=3))
rank, world = dist.get_rank(), dist.get_world_size()

if mode == "alias":
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    check("alias import gives a working smddp backend", torch.equal(t, torch.ones(4) * world * (world + 1) / 2))
    check("backend name", dist.get_backend() == "smddp", dist.get_backend())
    dist.destroy_process_group()
elif mode == "timeout":
    # Rank 1 skips the collective: rank 0 must get an error naming it within ~the 3 s timeout.
    if rank == 0:
        t0 = time.time()
        try:
            dist.all_reduce(torch.ones(1))
            check("missing rank raises", False, "all_reduce returned")
        except RuntimeError as e:
            took = time.time() - t0
            check("missing rank raises within the timeout", took < 10, f"{took:.1f} s")
            check("error names the collective and the missing rank", "allreduce" in str(e) and "[1]" in str(e), str(e))
    else:
        time.sleep(6)
    sys.stdout.flush()
    if rank == 0:
        done()  # exits 1 on failure
    os._exit(0)  # the communicator is aborted: leave without the (now failing) teardown
elif mode == "dataloader_fork":
    # A DataLoader worker (forked after init) that calls a collective: an error naming the fork,
    # not a collective run as this rank; and the worker's end leaves this rank's group working.
    class CallsACollective(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            try:
                dist.all_reduce(torch.full((4,), 1000.0))
                return "it ran"
            except Exception as e:  # noqa: BLE001 - the message is what counts
                return str(e)

    got = list(torch.utils.data.DataLoader(CallsACollective(), batch_size=None, num_workers=1,
                                           multiprocessing_context="fork"))
    check("a DataLoader worker's collective is refused, naming the fork",
          all("is a child forked from it" in g for g in got), got)
    for _ in range(3):
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        check("the group still sums after the worker ended", torch.equal(t, torch.full((4,), world * (world + 1) / 2)),
              t.tolist())
    dist.destroy_process_group()
elif mode == "bad_args":
    try:
        dist.all_gather([torch.empty(3), torch.empty(4)][:world], torch.ones(3))
        check("mismatched allgather sizes raise", world == 1, "no exception")
    except (RuntimeError, ValueError) as e:
        check("mismatched allgather sizes raise a clear error", "size" in str(e), str(e))
    try:
        dist.broadcast(torch.ones(2), src=world + 3)
        check("bad root raises", False, "no exception")
    except (RuntimeError, ValueError) as e:
        check("bad root raises", True)
    t = torch.ones(2)
    dist.all_reduce(t)
    check("group still works after rejected calls", torch.equal(t, torch.ones(2) * world))
    dist.destroy_process_group()
done()
