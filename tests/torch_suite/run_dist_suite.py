"""torch's own distributed test suite (_DistTestBase) against a backend, the way torch's
test_distributed_spawn.py runs it for gloo.

    python3 tests/torch_suite/run_dist_suite.py --backend smddp --world 2 [-k PATTERN] [--repeat N]

Environment it sets for torch's suite: BACKEND, WORLD_SIZE, TEMP_DIR (a fresh directory per run).
Spawned ranks re-import this file, so `import smddp` here registers the backend in every rank.
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
    args, rest = p.parse_known_args()
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="smddp-dist-suite-"))

import smddp  # noqa: E402,F401  (registers "smddp" in this process and in every spawned rank)
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
