#!/usr/bin/env python3
"""What each of the fleet page's queries costs the store, replayed one at a time.

    python bench/query_cost.py --data $SETS/f57-vmalert --head      # Prometheus' head
    python bench/query_cost.py --data $SETS/f57a-rules              # Prometheus' blocks
    python bench/query_cost.py --data $SETS/f57-vmalert --store victoriametrics
    python bench/query_cost.py --data SET --head --queries variants.promql [--json]

Starts the store on a data set ``bench/fleet.py`` built (as ``bench/dashboard_bench.py``
does: Prometheus on its blocks, on a copy of its ``head/`` with ``--head``, or
VictoriaMetrics on its ``vm/`` folder with the response cache off), loads the fleet page
twice through ``PrometheusData.fleet`` (the first finds the recording rules; the second's
queries are kept, exactly as sent), then sends each kept query alone ``--runs`` times and
reports the medians of:

- the store's CPU time (user + system, ``/proc/<pid>/stat``), in seconds;
- the bytes the store allocated (``go_memstats_alloc_bytes_total`` from its own
  ``/metrics``), in MiB, less what reading ``/metrics`` twice allocates with no query
  between (measured first, the same way);
- the rows (series) the answer holds.

``--queries FILE``: instead of the page's queries, the instant queries in FILE (one per line,
``#`` starts a comment), each at the data set's end: to compare a query with a variant of it.

The sum over the page's queries is what a page costs the store without the overlap of its
concurrent queries; a garbage collection that completes during a query is counted in that
query's CPU (the medians leave most of them out). Results: ``docs/benchmarks.md`` (fleet
scale, eleventh and twelfth passes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from bench.dashboard_bench import head_prometheus  # noqa: E402
from gpuscope.dashboard.data import DataError  # noqa: E402
from gpuscope.dashboard.data.http import PromApi  # noqa: E402
from gpuscope.dashboard.data.source import InvalidFilter, validate_namespace  # noqa: E402
from gpuscope.dashboard.plan import PrometheusData  # noqa: E402
from gpuscope.dashboard.prices import load_prices  # noqa: E402
from tests.stores import (  # noqa: E402
    Store,
    StoreError,
    start_prometheus,
    start_victoriametrics,
)

MIB = 2**20


@dataclass(frozen=True)
class Sent:
    """One query as the page sent it: the API path and its form."""

    path: str
    params: Mapping[str, str]

    @property
    def query(self) -> str:
        return self.params.get("query", "")


@dataclass(frozen=True)
class Cost:
    """One query replayed alone: medians over the runs."""

    query: str
    path: str
    rows: int
    cpu_s: float
    alloc_mib: float | None  # None: the store's /metrics has no allocation counter


class _Recording(PromApi):
    """The page's client: every POST it sends kept, in the order sent."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(url, timeout=timeout)
        self.sent: list[Sent] = []

    def post_form(self, path: str, params: Mapping[str, str],
                  decode: Callable[[bytes], Any] = json.loads) -> Any:
        self.sent.append(Sent(path, dict(params)))  # list.append: atomic across the threads
        return super().post_form(path, params, decode)


def page_queries(store: Store, end: float, window: float = 3600.0,
                 namespace: str | None = None, timeout: float = 60.0,
                 records: bool = False) -> list[Sent]:
    """The queries one fleet page over ``window`` seconds before ``end`` sends ``store``,
    after a first page that found out whether the recording rules are loaded; ``records``:
    the page from the verdicts' run records (``PrometheusData.read_records``)."""
    client = _Recording(store.url, timeout)
    source = PrometheusData(store.url, clock=lambda: end, timeout=timeout, client=client,
                            prices=load_prices() if records else None)
    source.read_records = records
    try:
        source.fleet(window, namespace)
        client.sent.clear()
        source.fleet(window, namespace)
    finally:
        source.close()
    return list(client.sent)


def instant_queries(lines: Sequence[str], end: float) -> list[Sent]:
    """Each non-empty, non-comment line as an instant query at ``end``."""
    return [Sent("/api/v1/query", {"query": q, "time": f"{end:.3f}", "nocache": "1"})
            for line in lines if (q := line.strip()) and not q.startswith("#")]


def _rows(data: Any) -> int:
    result = data.get("result") if isinstance(data, dict) else None
    return len(result) if isinstance(result, list) else 0


def _allocated(store: Store) -> float | None:
    return store.go_counters().allocated_bytes


def reading_cost(store: Store, runs: int) -> float | None:
    """What two reads of the store's ``/metrics`` allocate with nothing between, in bytes
    (the median of ``runs``): subtracted from each query's figure."""
    figures = []
    for _ in range(runs):
        before = _allocated(store)
        after = _allocated(store)
        if before is None or after is None:
            return None
        figures.append(after - before)
    return statistics.median(figures)


def replay(store: Store, client: PromApi, sent: Sent, runs: int,
           overhead: float | None) -> Cost:
    """``sent`` sent alone ``runs`` times: the medians of the store's CPU and allocation."""
    cpus: list[float] = []
    allocs: list[float] = []
    rows = 0
    for _ in range(runs):
        cpu0, alloc0 = store.cpu_seconds(), _allocated(store)
        rows = _rows(client.post_form(sent.path, sent.params))
        cpu1, alloc1 = store.cpu_seconds(), _allocated(store)
        cpus.append(cpu1 - cpu0)
        if alloc0 is not None and alloc1 is not None:
            allocs.append(alloc1 - alloc0 - (overhead or 0.0))
    return Cost(sent.query, sent.path, rows, statistics.median(cpus),
                statistics.median(allocs) / MIB if allocs else None)


def measure(store: Store, queries: Sequence[Sent], runs: int = 3, timeout: float = 60.0,
            log: Callable[[str], None] = print) -> list[Cost]:
    """Each of ``queries`` replayed alone (after one warm-up pass over all of them, which
    fills the store's caches as the page's first load did), in the order given."""
    client = PromApi(store.url, timeout=timeout)
    for sent in queries:
        client.post_form(sent.path, sent.params)
    overhead = reading_cost(store, max(3, runs))
    costs = []
    for sent in queries:
        cost = replay(store, client, sent, runs, overhead)
        costs.append(cost)
        log(_line(cost))
    return costs


def _line(cost: Cost) -> str:
    alloc = "   -   " if cost.alloc_mib is None else f"{cost.alloc_mib:5.0f} MiB"
    kind = "range  " if cost.path.endswith("query_range") else "instant"
    return f"{cost.cpu_s:6.2f} s {alloc} {cost.rows:7,d} rows {kind} {cost.query[:110]}"


def summary(costs: Sequence[Cost]) -> str:
    """The total and the costliest queries, by allocation (the garbage collector's pace)."""
    known = [c.alloc_mib for c in costs if c.alloc_mib is not None]
    total = sum(known) if known else None
    lines = [f"{len(costs)} queries: {sum(c.cpu_s for c in costs):.2f} s of the store's CPU"
             + ("" if total is None else f", {total:,.0f} MiB allocated")]
    for c in sorted(costs, key=lambda c: -(c.alloc_mib or 0.0))[:12]:
        lines.append("  " + _line(c))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a data set bench/fleet.py built")
    ap.add_argument("--store", choices=("prometheus", "victoriametrics"), default="prometheus")
    ap.add_argument("--head", action="store_true",
                    help="Prometheus on the set's head/ (bench/head.py) instead of its blocks")
    ap.add_argument("--queries", help="instant queries to replay instead of the page's, one "
                    "per line")
    ap.add_argument("--window", type=float, default=3600.0, help="the page's window, seconds")
    ap.add_argument("--namespace", help="the page filtered to this namespace")
    ap.add_argument("--records", action="store_true",
                    help="the page from the verdicts' run records (PrometheusData."
                    "read_records; a set with the runs)")
    ap.add_argument("--runs", type=int, default=3, help="replays per query (the median)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.window <= 0:
        print("query_cost: --runs must be >= 1 and --window > 0", file=sys.stderr)
        return 2
    if args.head and args.store != "prometheus":
        print("query_cost: --head is Prometheus' (--store prometheus)", file=sys.stderr)
        return 2
    if args.namespace is not None:
        try:
            args.namespace = validate_namespace(args.namespace)
        except InvalidFilter as exc:
            print(f"query_cost: --namespace: {exc}", file=sys.stderr)
            return 2
    folder = Path(args.data)
    sub = "head" if args.head else "tsdb" if args.store == "prometheus" else "vm"
    if not (folder / "meta.json").is_file() or not (folder / sub).is_dir():
        print(f"query_cost: {folder}: no meta.json and {sub}/ (build it with bench/fleet.py"
              f"{', then bench/head.py' if args.head else ''})", file=sys.stderr)
        return 1
    lines: list[str] = []
    if args.queries:
        try:
            lines = Path(args.queries).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"query_cost: {args.queries}: {exc}", file=sys.stderr)
            return 1
    try:
        end = float(fleet.load_meta(folder)["end"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"query_cost: {folder / 'meta.json'}: not a data set's meta.json ({exc})",
              file=sys.stderr)
        return 1
    try:
        with (head_prometheus(folder / "head", None) if args.head else
              start_prometheus(folder / "tsdb") if args.store == "prometheus" else
              start_victoriametrics(folder / "vm", cache=False)) as store:
            queries = (instant_queries(lines, end) if args.queries else
                       page_queries(store, end, args.window, args.namespace,
                                    records=args.records))
            if not queries:
                print("query_cost: no query to replay", file=sys.stderr)
                return 1
            costs = measure(store, queries, args.runs)
    except (StoreError, DataError) as exc:
        print(f"query_cost: {exc}", file=sys.stderr)
        return 1
    print(summary(costs))
    if args.json:
        print(json.dumps([asdict(c) for c in costs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
