"""Mid-size messages that arrive before their receives (docs/reliability.md, "An intermittent
hang across hosts"): a subgroup of ranks 1..3 (two hosts, one rank on the first and two on the
second) allgathers 64 KiB + 1 byte, every rank sleeping a random 0-2 ms first so that some
messages land before their receive is posted, and the world group reduces between rounds.
libfabric 2.1's rxm loses such a message now and then when it sends it by segmentation and
reassembly (16-128 KiB), which the transport turns off; before that fix, 300 rounds hung in about
half the runs.

Usage: early_mid_size.py ROUNDS. Prints "rank R ALL OK" or exits nonzero.
"""
import datetime
import random
import sys
import time

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker

ROUNDS = int(sys.argv[1])
SIZE = 64 * 1024 + 1
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4, "four ranks: two per host"
members = [1, 2, 3]
sub = dist.new_group(members)
check, done = checker()
rng = random.Random(rank)


def bytes_of(member, i):
    """What `member` contributes in round `i`."""
    return torch.arange(SIZE, dtype=torch.int64).add(member + i).remainder(251).to(torch.uint8)


failed = False
for i in range(ROUNDS):
    if rank in members:
        time.sleep(rng.random() * 0.002)
        mine = bytes_of(rank, i)
        out = torch.empty(len(members) * SIZE, dtype=torch.uint8)
        dist.all_gather_into_tensor(out, mine, group=sub)
        want = torch.cat([bytes_of(m, i) for m in members])
        if not torch.equal(out, want) and not failed:  # the first one reported; every rank goes on in step
            check(f"allgather round {i}", False, "wrong bytes")
            failed = True
    total = torch.ones(4)
    dist.reduce(total, dst=0)
    if rank == 0 and not torch.equal(total, torch.full((4,), float(world))) and not failed:
        check(f"reduce round {i}", False, str(total))
        failed = True
check("rounds", True)
dist.destroy_process_group()
done()
