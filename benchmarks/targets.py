"""Today's figures against the performance targets of #12 and #18, from what run_all.sh wrote.

    python3 benchmarks/targets.py [DIR]      (default DIR=docs/performance; writes DIR/targets.md)

Reads DIR/torch_np{2,4}/results.csv (smddp beside gloo, Open MPI and the single-core memcpy
ceiling, with the DDP and FSDP steps), DIR/contention_np{2,4}/results.csv (OMP_NUM_THREADS=1,
unset, and a busy process per core; with results_rounds.csv beside it, #18's ratios are paired
within each round; DIR/contention_dense_np{2,4}, the same at every 4x of the sizes, instead where
it exists) and DIR/netns_*.md (smddp-perf across two namespace hosts
beside iperf3 on the same link). Each target gets its worst point, where it is, how many points
miss the bar, and whether it is met. A point of smddp's that failed, read NaN or gave wrong results
is a miss ("not measured"), never a pass; a target with no input at all is "not measured". Ratios are of times (peer / smddp: above 1, smddp is faster) except
where the bar says otherwise. Never run as a test of speed: CI only checks the arithmetic.
"""
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_collectives import read_rows  # noqa: E402

WORLDS = (2, 4)
COLLS = ("allreduce", "allgather", "reduce_scatter")
LARGE = 8 << 20  # "large messages": from 8 MiB


def size_label(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def measured(r):
    return r is not None and r["time_us"] == r["time_us"] and not r.get("error") and r["wrong"] == 0


def load(path):
    return read_rows(path) if os.path.exists(path) else []


def index(rows, mode="1"):
    return {(r["backend"], r["op"], r["bytes"]): r for r in rows if r.get("mode", "1") == mode}


class Target:
    """One bar over a set of points (size, value); `higher` says which side of the bar passes."""

    def __init__(self, issue, what, where, bar, higher=True, unit="x", note=""):
        self.issue, self.what, self.where, self.bar, self.higher, self.unit = issue, what, where, bar, higher, unit
        self.points, self.note = [], note

    def add(self, size, value):
        """value None: smddp's point was not measured (failed, NaN, wrong results): a miss."""
        self.points.append((size, value if value is not None and value == value else None))

    def passes(self, v):
        return v is not None and (v >= self.bar if self.higher else v <= self.bar)

    def fmt(self, v):
        return f"{100 * v:.0f}%" if self.unit == "%" else f"{v:.2f}{self.unit}"

    def row(self):
        bar = ("≥ " if self.higher else "≤ ") + self.fmt(self.bar)
        if not self.points:
            return [self.issue, self.what, self.where, bar, "not measured" + (f" ({self.note})" if self.note else ""),
                    "n/a"]
        values = [p for p in self.points if p[1] is not None]
        failed = len(self.points) - len(values)
        miss = [p for p in self.points if not self.passes(p[1])]
        if values:
            worst = (min if self.higher else max)(values, key=lambda p: p[1])
            at = f" at {size_label(worst[0])}" if worst[0] is not None else ""
            today = f"worst {self.fmt(worst[1])}{at}"
        else:
            today = "not measured"
        if len(self.points) > 1:
            today += f"; {len(miss)} of {len(self.points)} points miss"
        if failed:
            today += f" ({failed} not measured)"
        return [self.issue, self.what, self.where, bar, today, "no" if miss else "yes"]


def one_node_targets(d):
    out = []
    for w in WORLDS:
        rows = load(os.path.join(d, f"torch_np{w}", "results.csv"))
        by = index(rows)
        sizes = sorted({r["bytes"] for r in rows if r["backend"] == "smddp" and r["op"] in COLLS})
        limit = {r["bytes"]: r for r in rows if r["backend"] == "memcpy"}
        for coll in COLLS:
            vs_mpi = Target("#12", f"{coll} vs Open MPI (time)", f"w={w}, one node, torch", 1.2,
                            note="torch's mpi backend has no reduce_scatter" if coll == "reduce_scatter" else "")
            vs_gloo = Target("#12", f"{coll} vs gloo (time)", f"w={w}, one node, torch", 5.0)
            vs_copy = Target("#12", f"{coll} busbw / memcpy, ≥ 8 MiB", f"w={w}, one node, torch", 0.8, unit="")
            for n in sizes:
                s = by.get(("smddp", coll, n))
                for t, peer in ((vs_mpi, "mpi"), (vs_gloo, "gloo")):
                    o = by.get((peer, coll, n))
                    if measured(o):  # a peer's failed point is not smddp's miss
                        t.add(n, o["time_us"] / s["time_us"] if measured(s) else None)
                if n >= LARGE and measured(limit.get(n)) and limit[n]["algbw"] > 0:
                    vs_copy.add(n, s["busbw"] / limit[n]["algbw"] if measured(s) else None)
            out += [vs_mpi, vs_gloo, vs_copy]
        for step in ("ddp_step", "fsdp_step"):
            t = Target("#12", f"{step.replace('_step', '').upper()} step, peers' best / smddp",
                       f"w={w}, one node, torch", 1.0)
            s = next((r for r in rows if r["backend"] == "smddp" and r["op"] == step), None)
            peers = [r["time_us"] for r in rows if r["backend"] in ("gloo", "mpi") and r["op"] == step and measured(r)]
            if s is not None and peers:
                t.add(None, min(peers) / s["time_us"] if measured(s) else None)
            out.append(t)
    return out


NETNS_IPERF = re.compile(r"iperf3 [0-9.]+ Gbit/s \(([0-9.]+) GB/s\)")
NETNS_IPERF_BIDIR = re.compile(r"iperf3 both ways at once, each way [0-9.]+ Gbit/s \(([0-9.]+) GB/s\)")
NETNS_RATE = re.compile(r"^\s*([0-9]+) B: ([0-9.]+) GB/s over the link", re.M)
NETNS_WRONG = re.compile(r"^# total #wrong: ([0-9]+)", re.M)


def between_hosts_targets(d):
    """The link rate against iperf3 one way (the bar as #12 sets it) and, where the run measured
    it, against iperf3 both ways at once: an allreduce between two hosts sends as much each way
    at the same time, which a veth pair carries at about 3/4 of its one-way rate."""
    out = []
    for path in sorted(glob.glob(os.path.join(d, "netns_*.md"))):
        name = os.path.basename(path)[len("netns_"):-len(".md")]
        text = open(path).read()
        wrong = NETNS_WRONG.search(text)
        right = wrong is not None and int(wrong.group(1)) == 0
        for pattern, what in ((NETNS_IPERF, "iperf3"), (NETNS_IPERF_BIDIR, "iperf3 both ways")):
            m = pattern.search(text)
            if what != "iperf3" and not m:
                continue  # runs before the two-way reference
            t = Target("#12", f"allreduce link rate / {what}, ≥ 1 MiB", f"2 namespace hosts, {name}", 0.8, unit="%")
            if m and float(m.group(1)) > 0:
                for size, rate in NETNS_RATE.findall(text):
                    if int(size) >= 1 << 20:
                        t.add(int(size), float(rate) / float(m.group(1)) if right else None)
            out.append(t)
    return out


def contention_targets(d):
    """#18's bars. Where the sweep kept every round (results_rounds.csv, `--rounds N` of
    torch_collectives.py), each ratio is taken within a round and the median over rounds is
    reported: on this machine a slow spell moves separate runs by more than the 1.2x bar, and
    within a round the modes of one backend ran back to back (`--paired`)."""
    out = []
    for w in WORLDS:
        # The dense sweep (run_all.sh step 2b, smddp and Open MPI at every 4x of 8 B-64 MiB) where
        # it was run: #18 asks every size, and the three-backend sweep beside it samples six.
        dense = os.path.join(d, f"contention_dense_np{w}")
        base = dense if os.path.isdir(dense) else os.path.join(d, f"contention_np{w}")
        per_round = load(os.path.join(base, "results_rounds.csv"))
        rounds = ([[r for r in per_round if r.get("round") == k] for k in sorted({r.get("round") for r in per_round})]
                  if per_round else [load(os.path.join(base, "results.csv"))])
        paired = " (median of per-round ratios)" if per_round else ""
        where = f"w={w}, allreduce, torch" + (", every 4x" if base == dense else "")
        same = Target("#18", "smddp OMP unset / OMP=1 (time)" + paired, where, 1.2, higher=False)
        vs_mpi = Target("#18", "OMP unset: Open MPI / smddp (time)" + paired, where, 1.0)
        hog_loss = Target("#18", "beside a busy core: smddp's slowdown / Open MPI's" + paired, where, 1.0,
                          higher=False)
        sizes = sorted({r["bytes"] for rs in rounds for r in rs if r["backend"] == "smddp"})
        for n in sizes:
            # Per ratio: the rounds whose peer side was measured (a round where Open MPI failed
            # says nothing of smddp), and smddp's ratio in each of them.
            ratios = {"same": [], "vs_mpi": [], "hog": []}
            needed = {"same": 0, "vs_mpi": 0, "hog": 0}
            for rows in rounds:
                one, unset, hog = index(rows, "1"), index(rows, "unset"), index(rows, "hog")
                s1, su, sh = (m.get(("smddp", "allreduce", n)) for m in (one, unset, hog))
                m1, mu, mh = (m.get(("mpi", "allreduce", n)) for m in (one, unset, hog))
                if s1 is not None or su is not None:
                    needed["same"] += 1
                    if measured(s1) and measured(su):
                        ratios["same"].append(su["time_us"] / s1["time_us"])
                if measured(mu):
                    needed["vs_mpi"] += 1
                    if measured(su):
                        ratios["vs_mpi"].append(mu["time_us"] / su["time_us"])
                if measured(m1) and measured(mh):
                    needed["hog"] += 1
                    if measured(s1) and measured(sh):
                        ratios["hog"].append((sh["time_us"] / s1["time_us"]) / (mh["time_us"] / m1["time_us"]))
            for key, target in (("same", same), ("vs_mpi", vs_mpi), ("hog", hog_loss)):
                if needed[key]:
                    # A round where smddp was not measured is a miss, not a round left out.
                    complete = len(ratios[key]) == needed[key]
                    target.add(n, statistics.median(ratios[key]) if complete else None)
        out += [same, vs_mpi, hog_loss]
    return out


def report(d):
    targets = one_node_targets(d) + between_hosts_targets(d) + contention_targets(d)
    rows = [t.row() for t in targets]
    met = sum(r[-1] == "yes" for r in rows)
    lines = ["# Against the targets (#12, #18)", "",
             f"Written by `benchmarks/targets.py` from the results beside it ({met} of {len(rows)} met). "
             "Time ratios are the peer's time over smddp's; \"worst\" is the point furthest from the bar.", "",
             "| issue | target | where | bar | today | met |", "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/performance"
    text = report(d)
    with open(os.path.join(d, "targets.md"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
