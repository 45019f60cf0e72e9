#!/usr/bin/env python3
"""The ``gpuscope-dashboard`` recording rules over a ``bench/fleet.py`` data set, as a store
that had evaluated them all along would hold them, for the scale benchmark.

    python bench/rules.py --data $SETS/f15 --out $SETS/f15-rules --store prometheus
    python bench/rules.py --data $SETS/f15 --out $SETS/f15-vmalert --store victoriametrics

- ``prometheus``: ``OUT/tsdb`` is the set's blocks (hard links) with the rules backfilled by
  ``promtool tsdb create-blocks-from rules``, one dependency level at a time (a rule that reads
  another needs that one's blocks loaded): 6-8 min at 5,000 nodes.
- ``victoriametrics``: ``OUT/vm`` is a copy (hard links) of the set's VictoriaMetrics folder
  with the rules replayed by ``vmalert -replay``, one dependency level per run, each made
  searchable (``/internal/force_flush``) before the next reads it. A single replay of the
  whole group with ``-replay.rulesDelay`` is what a user runs (docs/dashboard.md); at 5,000
  nodes a 3 s delay left a recorded series out for most of the fleet (docs/benchmarks.md,
  tenth pass), which a level per run cannot. VictoriaMetrics runs with a 128 MB write limit and
  a million series per query, as a 5,000-node replay needs. The verdicts' runs (rules that
  read their own past: ``dashboard/verdicts/runs.py``) are then recorded minute by minute
  (``tests.stores.record_runs``), as a live evaluation records them.
- ``prometheus``: the runs, which promtool's backfill cannot make (it evaluates a rule over
  the whole range at once), are recorded by a scratch VictoriaMetrics from the Prometheus'
  own recorded flags and written into the blocks (``tests.stores.record_runs_in_blocks``).

``OUT`` gets the set's ``meta.json`` and ``expected.json``, and then serves
``bench/dashboard_bench.py --data OUT`` and (from ``OUT/vm``) ``bench/head.py --data OUT``.
Needs Debian's ``prometheus`` (``promtool``) and ``victoria-metrics`` (``vmalert``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fleet import load_meta  # noqa: E402
from tests.stores import (  # noqa: E402
    backfill_rules,
    clone_tree,
    record_runs,
    record_runs_in_blocks,
    replay_rules,
    start_victoriametrics,
)

#: What a 5,000-node replay needs of VictoriaMetrics 1.79 (docs/dashboard.md): a rule's whole
#: window goes in one write (36.6 MB for the per-device work series over 1 h; 218 MB over a
#: 6-hour set, which 128 MiB refused, so about 0.9 GB over 24 h), and the throttling rule reads
#: more than the default 300,000 series.
VM_ARGS = ("-maxInsertRequestSize=1073741824", "-search.maxUniqueTimeseries=1000000")


def build(data: Path, out: Path, store: str) -> float:
    """``out`` as ``data`` with the rules recorded for ``store``; the seconds it took."""
    meta = load_meta(data)
    folder = "tsdb" if store == "prometheus" else "vm"
    if not (data / folder).is_dir():
        raise FileNotFoundError(f"{data / folder} is missing: build the set with "
                                f"bench/fleet.py --store {store} (or both)")
    if (out / folder).exists():
        raise FileExistsError(f"{out / folder} exists already: choose another --out")
    began = time.monotonic()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    for name in ("meta.json", "expected.json"):
        shutil.copy(data / name, out / name)
    clone_tree(data / folder, out / folder)
    if store == "prometheus":
        backfill_rules(out / "tsdb", meta["start"], meta["end"], work)
        record_runs_in_blocks(out / "tsdb", meta["start"], meta["end"], work)
    else:
        with start_victoriametrics(out / "vm", copy=False, extra_args=VM_ARGS) as vm:
            replay_rules(vm, meta["start"], meta["end"], work)
            record_runs(vm, meta["start"], meta["end"])
    shutil.rmtree(work)
    return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a set bench/fleet.py built")
    ap.add_argument("--out", type=Path, required=True, help="the new set's folder")
    ap.add_argument("--store", choices=("prometheus", "victoriametrics"), required=True)
    args = ap.parse_args(argv)
    try:
        seconds = build(args.data, args.out, args.store)
    except Exception as exc:  # one line, no traceback (a missing set, a tool that failed)
        print(f"rules: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: the gpuscope-dashboard rules recorded for {args.store} "
          f"in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
