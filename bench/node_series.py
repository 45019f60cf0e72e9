#!/usr/bin/env python3
"""What node-level series would cost the store to read, beside the per-device ones the fleet
page reads today: the measurement behind the leaner data model (``docs/benchmarks.md``,
fleet scale, fourteenth pass).

    python bench/node_series.py --data $SETS/f15-vmalert --out $SETS/f15-nodes
    python bench/query_cost.py --data $SETS/f15-nodes --store victoriametrics \\
        --queries bench/node_series.promql

Copies a data set ``bench/fleet.py`` built (its VictoriaMetrics folder, ``meta.json`` and
``expected.json``) to ``--out``, and records in the copy, one point a minute over the set's
window, the node-level series of :data:`NODE_SERIES`: each computed by the store from the
raw series (a range query, as a recording rule would compute it each minute) and written
back through ``/api/v1/import``. The set itself is not changed. ``bench/node_series.promql``
then compares reading each per-device answer with reading its node-level one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from tests.stores import Store, StoreError, start_victoriametrics  # noqa: E402

#: Each node-level series and the PromQL that computes it from the raw series: the node's
#: whole GPUs by model (the inventory's part the heatmap's groups and the KPIs need), and
#: the mean of its GPUs' utilization each minute (what the heatmap ranks nodes by).
NODE_SERIES = {
    "node:gpu_whole:count": 'count by (node, model) (gpu_info{parent_uuid=""})',
    "node:gpu_busy_ratio:avg1m": "avg by (node) (rate(gpu_busy_seconds_total[119999ms]))",
}
STEP = 60.0


def node_lines(store: Store, start: float, end: float) -> Iterator[bytes]:
    """The node-level series over ``[start, end]``, one JSON line per series (the import
    format: ``metric``, ``values``, ``timestamps`` in milliseconds)."""
    for name, promql in NODE_SERIES.items():
        data: dict[str, Any] = store.get("/api/v1/query_range", {
            "query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
            "step": f"{STEP:.0f}s"}, timeout=600)
        for row in data["result"]:
            points = [(round(float(t) * 1000), float(v)) for t, v in row["values"]]
            if not points:
                continue
            yield (json.dumps({
                "metric": {**row["metric"], "__name__": name},
                "values": [v for _, v in points],
                "timestamps": [t for t, _ in points],
            }) + "\n").encode()


def record(data: Path, out: Path) -> dict[str, int]:
    """Copies the set ``data`` to ``out`` and records :data:`NODE_SERIES` there; returns
    how many series of each name it wrote."""
    meta = fleet.load_meta(data)
    if not (data / "vm").is_dir():
        raise StoreError(f"{data} has no VictoriaMetrics folder (vm/)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("meta.json", "expected.json"):
        if (data / name).is_file():
            shutil.copy2(data / name, out / name)
    # A full copy, not hard links: the store writes into the folder it is given.
    shutil.copytree(data / "vm", out / "vm")
    end = float(meta["end"])
    start = end - float(meta["window"]) - 300.0
    with start_victoriametrics(out / "vm", copy=False, cache=False) as store:
        store.import_lines(node_lines(store, start, end))
        store.flush()
        return {name: int(store.scalar(f"count(last_over_time({name}[2m]))", end) or 0)
                for name in NODE_SERIES}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="a data set bench/fleet.py built, with its vm/ folder")
    ap.add_argument("--out", type=Path, required=True, help="where the copy goes (replaced)")
    args = ap.parse_args(argv)
    if args.out.resolve() == args.data.resolve():
        print("node_series: --out must not be --data (the set is copied, not changed)",
              file=sys.stderr)
        return 2
    try:
        counts = record(args.data, args.out)
    except (OSError, KeyError, ValueError, StoreError) as exc:
        print(f"node_series: {exc}", file=sys.stderr)
        return 1
    for name, n in counts.items():
        print(f"{args.out}: {n:,} series of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
