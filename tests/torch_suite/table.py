"""Compares runs of torch's distributed suite (run_dist_suite.py's verbose output) and writes a
markdown table: per run how many tests passed, were skipped or failed, and every test the
reference run (the first) passed that another run did not, with that run's outcome.

    python3 tests/torch_suite/table.py gloo=LOG1 smddp=LOG2 smddp-as-gloo=LOG3 [--title T]

Known exceptions (a test torch itself refuses for any backend but gloo, or one that asserts
gloo's own name) are listed with their reasons in EXCEPTIONS and marked in the table; in a plain
run (a label without "as-gloo") a skip is torch's gloo-only gate, shown with torch's reason; any
other difference is a failure of ours and makes the exit status 1.
"""
import argparse
import re
import sys

# unittest's verbose lines: "test_x (module.Class.test_x) ... ok" / "... skipped 'why'" / "... ERROR"
LINE = re.compile(r"^(test_\w+) \([\w.]+\)(?: \.\.\.)? ?(.*)$")

# Tests smddp cannot pass for reasons outside smddp, with the reason (docs/pytorch.md repeats them).
EXCEPTIONS = {
    # filled from measured runs only (trixie, torch 2.6, w=2, 2026-11-24, w=3, 2026-11-25; forky,
    # torch 2.14, w=2 and w=3, 2026-11-25): name -> reason
    "test_get_backend": "the as-gloo runner's: the test asserts the group's backend is named BACKEND, "
                        "which that runner sets to 'gloo'",
    "test_monitored_barrier_gloo": "torch 2.6's: monitored_barrier raises 'only implemented for GLOO "
                                   "backend' for any other backend (torch 2.14 lets it through: it passes)",
    "test_monitored_barrier_gloo_subgroup": "torch 2.6's: as test_monitored_barrier_gloo",
}


def parse(path):
    """{test: (outcome, detail)}, outcome in ok, skipped, fail, error, expected-failure."""
    out, pending = {}, None
    with open(path, errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = LINE.match(line)
            if m:
                pending = m.group(1)
                rest = m.group(2)
            elif pending and line.startswith(("ok", "skipped", "ERROR", "FAIL", "expected failure")):
                rest = line
            elif pending and pending not in out and " ... " in line:
                rest = line.rsplit(" ... ", 1)[1]  # a test with a docstring: "Docstring ... ok"
            else:
                continue
            rest = rest.strip()
            if rest.startswith("..."):
                rest = rest[3:].strip()
            if not rest:
                continue  # the outcome comes on a later line (output in between)
            if rest == "ok":
                out[pending] = ("ok", "")
            elif rest.startswith("skipped"):
                out[pending] = ("skipped", rest[len("skipped"):].strip().strip("'\""))
            elif rest.startswith("expected failure"):
                out[pending] = ("expected-failure", "")
            elif rest.startswith("ERROR"):
                out[pending] = ("error", "")
            elif rest.startswith("FAIL"):
                out[pending] = ("fail", "")
            else:
                continue
            pending = None
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", help="LABEL=LOG; the first is the reference")
    p.add_argument("--title", default="torch's distributed suite")
    a = p.parse_args()
    runs = []
    for r in a.runs:
        label, path = r.split("=", 1)
        runs.append((label, parse(path)))
    ref_label, ref = runs[0]
    print(f"### {a.title}\n")
    print("| run | tests | ok | skipped | failed or error |")
    print("| --- | --- | --- | --- | --- |")
    for label, res in runs:
        n = {k: sum(1 for v in res.values() if v[0] == k) for k in ("ok", "skipped", "fail", "error")}
        print(f"| {label} | {len(res)} | {n['ok']} | {n['skipped']} | {n['fail'] + n['error']} |")
    bad = 0
    for label, res in runs[1:]:
        missing = sorted(t for t, v in ref.items() if v[0] == "ok" and res.get(t, ("absent", ""))[0] != "ok")
        print(f"\nTests {ref_label} passes that {label} does not: {len(missing)}\n")
        if not missing:
            continue
        print(f"| test | {label} | why |")
        print("| --- | --- | --- |")
        gated = "as-gloo" not in label  # a plain run: torch's gloo-only gates skip tests
        for t in missing:
            outcome, detail = res.get(t, ("absent", ""))
            if gated and outcome == "skipped":  # torch's gate came first, whatever would follow
                why = f"torch skips it for any backend but gloo ({detail}); see the as-gloo run"
            else:
                why = EXCEPTIONS.get(t, "")
            bad += 0 if why else 1
            print(f"| {t} | {outcome} | {why or detail or '**ours to fix**'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
