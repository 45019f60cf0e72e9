#!/usr/bin/env python3
"""What the ``gpuscope-dashboard`` recording rules cost the Prometheus that evaluates them.

    python bench/rules_cost.py --data $SETS/f57-rules [--runs 3] [--json]
    python bench/rules_cost.py --data $SETS/f57-vmalert --store victoriametrics

Starts Debian's ``prometheus`` on a data set ``bench/fleet.py`` built (with the rules
backfilled: the rules that read other rules read their recorded series, as in a running
group), then evaluates each rule's expression (``recording_rules()``, in the group's order)
once as an instant query at the group's last evaluation instant, and reads the store's CPU
time (user + system, ``/proc/<pid>/stat``) before and after: the best of ``--runs`` per rule,
and the series each yields. The query API also encodes each answer as JSON, which a rule
evaluation does not: the figures are an upper bound on the group's cost per evaluation
(once a minute). ``--store victoriametrics``: the same on the set's VictoriaMetrics folder
with the rules replayed by vmalert, whose evaluations are such queries (the store's side of
them; vmalert's own CPU and the writes back are not counted). Results: ``docs/benchmarks.md``
(fleet scale, fifth and sixth passes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from gpuscope.dashboard.plan.rules import RULES, recording_rules  # noqa: E402
from tests.stores import (  # noqa: E402
    Store,
    StoreError,
    start_prometheus,
    start_victoriametrics,
)


def measure(store: Store, end: float, runs: int) -> dict[str, Any]:
    # The group's last instant: the timestamp of a dense recorded series' last sample.
    stamps = store.query(f"max(timestamp({RULES['util']}))", end)
    if not stamps:
        raise SystemExit("no recorded series in the data set: backfill the rules first "
                         "(docs/benchmarks.md, the commands)")
    at = float(stamps[0]["value"][1])
    rules: dict[str, Any] = {}
    for record, expr in recording_rules():
        best, series = None, 0
        for _ in range(runs):
            before = store.cpu_seconds()
            series = len(store.query(expr, at))
            took = store.cpu_seconds() - before
            best = took if best is None else min(best, took)
        rules[record] = {"cpu_s": round(best or 0.0, 3), "series": series}
        print(f"{record:48s} {best or 0.0:6.2f} s CPU {series:8,d} series", flush=True)
    total = sum(r["cpu_s"] for r in rules.values())
    print(f"{'the group, once (an upper bound)':48s} {total:6.2f} s CPU", flush=True)
    return {"at": at, "rules": rules, "total_cpu_s": round(total, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a data set bench/fleet.py built, with "
                    "the gpuscope-dashboard rules backfilled")
    ap.add_argument("--store", choices=("prometheus", "victoriametrics"), default="prometheus",
                    help="victoriametrics: the set's vm/ folder with the rules replayed by "
                    "vmalert (docs/benchmarks.md); its response cache off, as for vmalert's "
                    "evaluations at a new instant each minute")
    ap.add_argument("--runs", type=int, default=3, help="evaluations per rule (the best)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    folder = Path(args.data)
    sub = "tsdb" if args.store == "prometheus" else "vm"
    if not (folder / "meta.json").exists() or not (folder / sub).is_dir():
        print(f"rules_cost: {folder}: no meta.json and {sub}/ (build it with bench/fleet.py)",
              file=sys.stderr)
        return 1
    end = fleet.load_meta(folder)["end"]
    try:
        with (start_prometheus(folder / "tsdb") if args.store == "prometheus" else
              start_victoriametrics(folder / "vm", cache=False,
                                    extra_args=["-search.maxUniqueTimeseries=1000000"])
              ) as store:
            result = measure(store, end, max(1, args.runs))
    except StoreError as exc:
        print(f"rules_cost: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
