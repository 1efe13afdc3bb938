"""torch's own distributed test suite (_DistTestBase) against a backend, the way torch's
test_distributed_spawn.py runs it for gloo.

    python3 tests/torch_suite/run_dist_suite.py --backend smddp --world 2 [-k PATTERN] [--repeat N]
        [--as-gloo]

Environment it sets for torch's suite: BACKEND, WORLD_SIZE, TEMP_DIR (a fresh directory per run).
Spawned ranks re-import this file, so `import smddp` here registers the backend in every rank.

--as-gloo lifts the suite's name gates: torch selects many tests by comparing BACKEND with
"gloo", so a plugin backend never runs them. With it the suite sees BACKEND=gloo while every
process group it makes (init_process_group, new_group, new_subgroups) is smddp. Inside this
runner only; the product never pretends to be gloo (tests asserting gloo's own name then fail).
"""
import argparse
import os
import sys
import tempfile
import unittest

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="smddp")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("-k", action="append", default=[],
                   help="run only tests whose name contains this (ending in $: whose name ends so)")
    p.add_argument("--repeat", type=int, default=1, help="run the selection this many times")
    p.add_argument("--as-gloo", action="store_true", help="let the suite's gates see gloo; groups are smddp")
    args, rest = p.parse_known_args()
    if args.as_gloo:
        os.environ["SMDDP_SUITE_AS_GLOO"] = args.backend
    os.environ["BACKEND"] = "gloo" if args.as_gloo else args.backend
    os.environ["WORLD_SIZE"] = str(args.world)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="smddp-dist-suite-"))

import smddp  # noqa: E402,F401  (registers "smddp" in this process and in every spawned rank)
import torch.distributed as dist  # noqa: E402

if os.environ.get("SMDDP_SUITE_AS_GLOO"):
    _real = os.environ["SMDDP_SUITE_AS_GLOO"]

    def _swap(backend):
        return _real if backend in (None, "gloo", dist.Backend.GLOO) else backend

    def _wrap(fn):
        def wrapper(*a, **kw):
            pos = 0 if fn.__name__ == "init_process_group" else 2  # where `backend` sits
            if "backend" in kw:
                kw["backend"] = _swap(kw["backend"])
            elif len(a) > pos:
                a = a[:pos] + (_swap(a[pos]),) + a[pos + 1:]
            elif fn.__name__ == "init_process_group":
                kw["backend"] = _real
            return fn(*a, **kw)
        wrapper.__name__ = fn.__name__
        return wrapper

    for _name in ("init_process_group", "new_group"):
        setattr(dist, _name, _wrap(getattr(dist, _name)))
        setattr(dist.distributed_c10d, _name, getattr(dist, _name))
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    def wanted(test_id, k):
        return test_id.endswith("." + k[:-1]) if k.endswith("$") else k in test_id

    tests = [t for t in suite if not args.k or any(wanted(t.id(), k) for k in args.k)]
    runner = unittest.TextTestRunner(verbosity=2)
    ok = True
    for i in range(args.repeat):
        res = runner.run(unittest.TestSuite(tests))
        ok = ok and res.wasSuccessful()
    sys.exit(0 if ok else 1)
