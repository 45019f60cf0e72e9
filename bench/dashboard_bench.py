#!/usr/bin/env python3
"""How fast the fleet page loads for a large simulated fleet behind a real store.

    python bench/dashboard_bench.py                 # 500 nodes, 15 s step, Prometheus, 1 h
    python bench/dashboard_bench.py --nodes 100 --no-browser
    python bench/dashboard_bench.py --data $SETS/f57 --store both --no-browser
    python bench/dashboard_bench.py --data $SETS/f57-rules --store prometheus \
        --no-browser [--namespace research-0] [--raw] [--drill-downs]  # + the rules backfilled
    python bench/dashboard_bench.py --data $SETS/f57-vmalert --head --store prometheus \
        --no-browser [--store-gogc 200]   # the hour in Prometheus' head (bench/head.py)

1. The fleet (``bench/fleet.py``): nodes playing the demo scenarios through the exporter's
   own SimulatedSource, attribution and collectors, one sample per series every ``--step``
   seconds over the window plus 5 minutes of look-back, as Prometheus TSDB blocks (promtool
   ``create-blocks-from openmetrics``) and a VictoriaMetrics data folder (``/api/v1/import``);
   built into ``--keep DIR`` (reused when it holds the same --nodes/--step/--window) or
   a temporary folder, or taken as it is from ``--data DIR`` (a set ``bench/fleet.py`` built).
2. Each store (``--store``): Debian's ``prometheus`` or ``victoria-metrics`` started on it
   (``tests/stores.py``; no scraping: 500 exporters do not fit on 2 cores); with ``--head``,
   Prometheus on a copy of the set's ``head/`` (``bench/head.py``), which it replays into
   its head as a restarted Prometheus does; with ``--store-gogc``, the store's Go garbage
   collector target.
3. Measures, at the data's end time: the page's queries (``PrometheusData.fleet``, and the
   registry's step queries sent beside it over the same window, as the service sends
   them), the analysis and rendering (``build_fleet_view`` + figures + every section's
   tables), each section's share of the rendering (:func:`section_times`), the showback's
   own parts (the ``holdings`` query sent alone, :func:`holdings_cost`; ``showback()`` within
   the analysis, :func:`timing`), the full page load in headless Chromium (navigation until
   the idle-node table, the heatmap, the stragglers table and the cost-by-owner tables are
   drawn), the queries one page load sends, and then the store's RSS (``VmRSS``, and its peak
   ``VmHWM``) and series count; and
   compares the verdicts with the fleet's expected ones (``bench/fleet.py``'s ``expected``),
   and the showback's owners with the page's totals (:func:`showback_totals`: $ spent, $ idle
   and $ spinning adding up to the KPIs to the cent).

``--began-within MINUTES``: with the recording rules, the findings made to begin within the
window, ``MINUTES`` before its end (:func:`begin_within`: every idle and allocated-idle
flag, and the spinning devices' flags and signals, removed before then in the store's copy
of the set): a fleet whose idle, spinning and allocated-idle findings began in this hour.

``--cluster NAME``: the page scoped to one cluster (``build_fleet_view(..., cluster=NAME)``, as
the cluster picker asks it: the same queries, the analysis of that cluster's nodes alone),
its verdicts compared with that cluster's share of the expected ones (:func:`cluster_expected`).

A set built with ``bench/fleet.py --clusters N`` names its store label in ``meta.json``
(``cluster_label``); the page is then given it (``PrometheusData(cluster_label=...)``, the
CLI's ``--cluster-label``) and keys nodes ``cluster/node``, as the set's expected verdicts do.

Needs Debian's ``prometheus`` (promtool), ``victoria-metrics`` and, for the browser part,
``chromium``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from gpuscope.dashboard import ids, sections, views  # noqa: E402
from gpuscope.dashboard.data import DataError, validate_cluster  # noqa: E402
from gpuscope.dashboard.data.promql import any_of  # noqa: E402
from gpuscope.dashboard.data.recorded import RULES  # noqa: E402
from gpuscope.dashboard.figures import heatmap_figure  # noqa: E402
from gpuscope.dashboard.plan import PrometheusData  # noqa: E402
from gpuscope.dashboard.prices import load_prices  # noqa: E402
from gpuscope.dashboard.series import gc_paused  # noqa: E402
from gpuscope.dashboard.verdicts import registry  # noqa: E402
from gpuscope.dashboard.verdicts.owners import OwnerCost  # noqa: E402
from gpuscope.dashboard.views import FleetView, build_fleet_view  # noqa: E402
from tests.stores import (  # noqa: E402
    Store,
    StoreError,
    free_port,
    proc_stat,
    start_prometheus,
    start_victoriametrics,
    stat_cpu_seconds,
)

SCRAPE = 15.0  # the default step (bench/load.py builds its fleet with it)
CHROMIUM = "/usr/bin/chromium"
#: The showback's tables (``cost-by-owner``), which the browser load waits for too.
COST_TABLES = (ids.COST_BY_CLUSTER_TABLE, ids.COST_BY_NAMESPACE_TABLE, ids.COST_BY_WORKLOAD_TABLE)
STORES = {"prometheus": ("prometheus",), "victoriametrics": ("victoriametrics",),
          "both": ("prometheus", "victoriametrics")}


def openmetrics(nodes: int, end: float, times: int) -> Iterator[str]:
    """``nodes`` nodes' samples every :data:`SCRAPE` s, ``times`` of them ending at ``end``,
    as OpenMetrics for promtool (``bench/load.py``'s fleet)."""
    window = (times - 1) * SCRAPE - fleet.LOOKBACK
    return fleet.Fleet(fleet.Shape(nodes, SCRAPE, window, end)).openmetrics()


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {url}")


class BrowserLoad(NamedTuple):
    """One page load in Chromium: seconds from navigation until the page is drawn
    (``total``: the first moment every element :func:`drawn_conditions` names is there, as
    the page itself sees it), until the fleet callback's answer was in (``answer``, None
    where it was not seen), and that answer's size in bytes (the rest of ``total`` is the
    browser drawing it); ``driver``: until Playwright's waits for those elements returned
    (later where the page's main thread is busy with something else then, such as the
    workload view's chart drawn after the page: Playwright's check runs on that thread).
    The CPU seconds the load took (from navigation until Playwright saw it drawn), where
    read: ``chromium_cpu``, of Chromium's processes (browser, renderers, GPU and utility);
    ``own_cpu``, of this process (the dashboard's server and Playwright's client);
    ``store_cpu``, of the store. On one machine the three share its cores."""

    total: float
    answer: float | None
    answer_bytes: int | None
    driver: float | None = None
    chromium_cpu: float | None = None
    own_cpu: float | None = None
    store_cpu: float | None = None


def chromium_cpu(under: int) -> dict[int, float]:
    """CPU seconds so far of each Chromium process (its command name begins with "chrom")
    that descends from the process ``under`` (Playwright's driver starts the browser, which
    starts the rest), by pid; a process gone while read is left out."""
    stats: dict[int, tuple[str, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = proc_stat(int(entry))
            except OSError:  # gone meanwhile
                continue
    parent = {pid: int(fields[1]) for pid, (_, fields) in stats.items()}
    out: dict[int, float] = {}
    for pid, (comm, fields) in stats.items():
        ancestor = parent[pid]
        while ancestor > 1 and ancestor != under:
            ancestor = parent.get(ancestor, 0)
        if ancestor == under and comm.startswith("chrom"):
            out[pid] = stat_cpu_seconds(fields)
    return out


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes of ``after`` used since ``before`` (a process started
    meanwhile counts from 0)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def drawn_conditions(filtered: bool) -> list[tuple[str, bool]]:
    """What a drawn page shows, as (CSS selector, whether its text must not be empty): the
    idle-node table's rows, the heatmap, the stragglers table's and the showback's tables'
    rows (``filtered``, a namespace's page, whose tables may rightly be empty: the note under
    each, which the same callback answer fills)."""
    out = [(f"#{ids.IDLE_NODES_TABLE} td.dash-cell", False),
           (f"#{ids.FLEET_HEATMAP} .heatmaplayer", False)]
    if filtered:
        return out + [(f"#{note}", True) for note in (
            ids.STRAGGLERS_NOTE, *(t.replace("-table", "-note") for t in COST_TABLES))]
    return out + [(f"#{table} td.dash-cell", False)
                  for table in (ids.STRAGGLERS_TABLE, *COST_TABLES)]


def drawn_script(conditions: list[tuple[str, bool]]) -> str:
    """A script run in the page before its own: it sets ``window.__gpuscopeDrawn`` to the
    time (ms since the epoch) at which every condition first held, checked every 5 ms."""
    return f"""(() => {{
        const conditions = {json.dumps(conditions)};
        const met = () => conditions.every(([sel, text]) => {{
            const el = document.querySelector(sel);
            return el !== null && (!text || (el.textContent || "").length > 0);
        }});
        const check = () => {{
            if (met()) {{ window.__gpuscopeDrawn = performance.timeOrigin + performance.now(); }}
            else {{ setTimeout(check, 5); }}
        }};
        window.__gpuscopeDrawn = null;
        setTimeout(check, 5);
    }})();"""


def fleet_answer(finished: list[tuple[str, float, int]], began: float
                 ) -> tuple[float | None, int | None]:
    """Of the requests a load finished (``(request body, end as seconds since the epoch,
    response bytes)``), the fleet callback's (its body names the ``fleet-kpis`` output):
    seconds from ``began`` (the navigation's start, seconds since the epoch) to its answer's
    end, and its bytes; the last such where a load saw several (a refresh)."""
    mine = [(end, size) for body, end, size in finished
            if f"{ids.FLEET_KPIS}.children" in body]
    if not mine:
        return None, None
    end, size = mine[-1]
    return end - began, size


def browser_load(url: str, runs: int, filtered: bool = False,
                 store_cpu: Callable[[], float] | None = None) -> list[BrowserLoad]:
    """Each load from navigation until the page is drawn (:func:`drawn_conditions`, timed
    in the page, :func:`drawn_script`; and until Playwright saw it); and when the fleet
    callback's answer was in (:class:`BrowserLoad`, from Playwright's request timing)."""
    from playwright.sync_api import Request, sync_playwright

    times: list[BrowserLoad] = []
    finished: list[tuple[str, float, int]] = []

    def on_finished(request: Request) -> None:
        if "_dash-update-component" not in request.url:
            return
        timing = request.timing  # startTime: ms since the epoch; responseEnd: ms after it
        finished.append((request.post_data or "",
                         (timing["startTime"] + timing["responseEnd"]) / 1000.0,
                         request.sizes()["responseBodySize"]))

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, viewport={"width": 1400,
                                                                        "height": 1000},
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"])
        page = ctx.new_page()
        page.on("requestfinished", on_finished)
        conditions = drawn_conditions(filtered)
        page.add_init_script(drawn_script(conditions))
        me = os.getpid()
        for _ in range(runs):
            finished.clear()
            cpu = (chromium_cpu(me), time.process_time(), store_cpu() if store_cpu else 0.0)
            began, began_epoch = time.perf_counter(), time.time()
            page.goto(url)
            for sel, text in conditions:
                if text:
                    page.wait_for_function(
                        f"(document.querySelector({sel!r}) || {{}}).textContent",
                        timeout=60_000)
                else:
                    page.wait_for_selector(sel, timeout=60_000)
            driver = time.perf_counter() - began
            spent = (cpu_spent(cpu[0], chromium_cpu(me)), time.process_time() - cpu[1],
                     store_cpu() - cpu[2] if store_cpu else None)
            page.wait_for_function("window.__gpuscopeDrawn !== null", timeout=60_000)
            drawn = float(page.evaluate("window.__gpuscopeDrawn")) / 1000.0 - began_epoch
            times.append(BrowserLoad(drawn, *fleet_answer(finished, began_epoch), driver,
                                     *spent))
        ctx.close()
    return times


def data_set(args: argparse.Namespace, stores: tuple[str, ...]) -> tuple[Path, dict[str, Any],
                                                                         bool]:
    """The data set folder, its meta, and whether it is temporary (removed at the end)."""
    if args.data:
        folder = Path(args.data)
        if not (folder / "meta.json").exists():
            raise SystemExit(f"{folder}: no meta.json (build it with bench/fleet.py)")
        meta = fleet.load_meta(folder)
        prom_dir = "head" if args.head else "tsdb"
        missing = [s for s in stores if not (folder / (prom_dir if s == "prometheus" else "vm"))
                   .is_dir()]
        if missing:
            raise SystemExit(f"{folder} holds no data for {', '.join(missing)}"
                             + (" (no head/: build it with bench/head.py)" if args.head else ""))
        return folder, meta, False
    folder = Path(args.keep or tempfile.mkdtemp(prefix="gpuscope-bench-"))
    if (folder / "meta.json").exists():
        meta = fleet.load_meta(folder)
        have = [s for s in stores if (folder / ("tsdb" if s == "prometheus" else "vm")).is_dir()]
        if ((meta["nodes"], meta["step"], meta["window"]) == (args.nodes, args.step, args.window)
                and have == list(stores)):
            print(f"reusing {meta['samples']:,} samples ({meta['series']:,} series) in {folder}",
                  flush=True)
            return folder, meta, False
    meta = fleet.build(folder, args.nodes, step=args.step, window=args.window, stores=stores)
    print(f"generated {meta['samples']:,} samples ({meta['series']:,} series) for "
          f"{meta['nodes']} nodes, {meta['gpus']} GPUs in {meta['build_s']:.1f}s", flush=True)
    return folder, meta, not args.keep


def page_source(url: str, meta: dict[str, Any], args: argparse.Namespace) -> PrometheusData:
    """The page's data source at the set's end time, with the set's cluster label where it
    has clusters (``bench/fleet.py --clusters``), the store's default otherwise."""
    extra = {"cluster_label": meta["cluster_label"]} if meta.get("cluster_label") else {}
    end = meta["end"]
    # Priced as the dashboard prices (its --prices); with --records the page reads the idle
    # and allocated-idle findings from the verdicts' run records where they cover its
    # history (PrometheusData.read_records).
    source = PrometheusData(url, clock=lambda: end, timeout=args.timeout,
                            prices=load_prices(), **extra)
    source.read_records = bool(getattr(args, "records", False))
    if getattr(args, "no_summaries", False):
        # Every finding's steps, as for a fleet whose findings began within the window:
        # the sets' findings hold over all of it, which the rules' run summaries describe.
        source.summaries = False
    return source


def section_times(view: FleetView) -> dict[str, float]:
    """The rendering's parts for ``view``, each timed alone, in seconds: the heatmap's
    figure (``heatmap``) and, per section of the page by its id (``registry.SECTIONS``, so a
    new section is timed as soon as it is registered), what :func:`sections.fill` does for
    it (its header, each table's first rows and note) with the JSON encoding of those
    values. Raises ``RuntimeError`` if ``sections.fill`` writes outputs this does not
    (``sections.outputs``): the parts would no longer add up to the page's rendering."""
    began = time.perf_counter()
    heatmap_figure(view.heatmap).to_json()
    out = {"heatmap": time.perf_counter() - began}
    covered: set[tuple[str, str]] = set()
    for section in registry.SECTIONS:
        began = time.perf_counter()
        values: dict[tuple[str, str], Any] = {}
        if section.header_id:
            values[(section.header_id, "children")] = sections.HEADERS[section.header_id](view)
        for table in section.tables:
            rows, note, _ = sections.table_rows(view, table.id, {},
                                                min(sections.MAX_ROWS, sections.TOP_ROWS))
            values[(table.id, "data")] = rows
            values[(table.note_id, "children")] = note
        json.dumps({f"{k[0]}.{k[1]}": v for k, v in values.items()}, default=str)
        out[section.id] = time.perf_counter() - began
        covered |= values.keys()
    if covered != set(sections.outputs()):
        raise RuntimeError("sections.fill writes other outputs than section_times times: "
                           f"{sorted(set(sections.outputs()) ^ covered)}")
    return out


def cluster_expected(meta: dict[str, Any], cluster: str) -> dict[str, Any]:
    """The expected verdicts of ``cluster``'s nodes alone: the set's plan made again from
    its ``meta.json`` (``bench/fleet.py``'s :func:`~bench.fleet.plan` and
    :func:`~bench.fleet.spread`: the same command gives the same nodes) and judged by
    :func:`~bench.fleet.expected`. ValueError: the set has no such cluster."""
    mix = (fleet.TEMPLATES if meta.get("flagged") is None
           else fleet.flagged_mix(meta["flagged"]))
    nodes = fleet.plan(meta["nodes"], mix)
    if meta.get("clusters"):
        nodes = fleet.spread(nodes, meta["clusters"])
    mine = [n for n in nodes if n.cluster == cluster]
    if not mine:
        raise ValueError(f"the data set has no cluster {cluster!r}: its clusters are "
                         f"{sorted({n.cluster for n in nodes if n.cluster})}")
    return fleet.expected(mine).to_json()


#: How far the owners' sum may be from the page's total and still add up "to the cent".
CENT = 0.005


def showback_totals(view: FleetView) -> dict[str, Any]:
    """The showback's owners summed (``math.fsum``) beside the page's totals they must add up
    to (docs/dashboard.md, cost by owner): $ spent to ``kpis.spent``, $ idle to
    ``kpis.wasted``, $ spinning to ``kpis.wasted_spinning``; ``differ``: those more than
    half a cent apart. Over the whole page only (a namespace filter keeps that namespace's
    owners, and the KPIs stay the fleet's)."""
    k = view.kpis
    pairs = {"spent": (_owners_sum(view.owners, "spent"), k.spent),
             "idle": (_owners_sum(view.owners, "idle"), k.wasted),
             "spinning": (_owners_sum(view.owners, "spinning"), k.wasted_spinning)}
    return {"owners": len(view.owners),
            **{key: {"owners": round(got, 4), "kpi": round(want, 4),
                     "difference": got - want} for key, (got, want) in pairs.items()},
            "differ": sorted(key for key, (got, want) in pairs.items()
                             if abs(got - want) >= CENT)}


def _owners_sum(owners: tuple[OwnerCost, ...], field: str) -> float:
    return math.fsum(getattr(o, field) for o in owners)


def role_counts(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]
                ) -> dict[str, list[int]]:
    """What a page's answers brought by role (``[bytes, series, answers]``: ``after`` less
    ``before``, the store's :attr:`answers_by_role` around the page), the most bytes first;
    the queries sent outside the fleet page's plan (the registry's step queries) under
    :data:`OTHER_ROLE`."""
    out = {}
    for role, counts in after.items():
        was = before.get(role, (0, 0, 0))
        diff = [c - w for c, w in zip(counts, was, strict=True)]
        if diff[2] > 0:
            out[role or OTHER_ROLE] = diff
    return dict(sorted(out.items(), key=lambda kv: (-kv[1][0], kv[0])))


#: :func:`role_counts`' name for the answers to queries of no role.
OTHER_ROLE = "(step queries)"


@contextmanager
def timing(module: Any, name: str, into: list[float]) -> Iterator[None]:
    """``module.name`` (a function the page calls by that name) timed at each call, the
    seconds appended to ``into``; restored at the end."""
    original: Callable[..., Any] = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - began)

    setattr(module, name, timed)
    try:
        yield
    finally:
        setattr(module, name, original)


def holdings_cost(store: Store, source: PrometheusData, window_seconds: float, runs: int
                  ) -> dict[str, Any]:
    """The page's ``holdings`` queries (:meth:`PrometheusData.holdings_queries`, held and
    used, from the recording rules where the page reads them) sent alone as the page sends
    them (instant queries at the window's end, one after the other), ``runs`` times after a
    warm-up: the medians of their wall time (the answers decoded and keyed, as the page
    reads them) and of the store's CPU, and the rows they answer."""
    window = source.window(window_seconds)
    rules, _ = source._check_rules(window)
    queries = source.holdings_queries(window, rules)
    walls, cpus, rows = [], [], 0
    for _ in range(runs + 1):
        cpu = store.cpu_seconds()
        began = time.perf_counter()
        rows = sum(len(source.instant(promql, window.end)) for promql in queries)
        walls.append(time.perf_counter() - began)
        cpus.append(store.cpu_seconds() - cpu)
    return {"holdings_query_s": round(statistics.median(walls[1:]), 4),
            "holdings_query_cpu_s": round(statistics.median(cpus[1:]), 3),
            "holdings_rows": rows, "holdings_from_rules": rules}


def verdicts(view: FleetView, expected: dict[str, Any]) -> dict[str, Any]:
    """The page's counts beside the fleet's expected ones."""
    k = view.kpis
    got = {"idle_nodes": k.idle_nodes, "idle_gpus": k.idle, "spinning": k.spinning,
           "throttled": k.throttled, "starved": len(view.starved_rows),
           "stragglers": len(view.straggler_rows),
           "allocated_idle": len(view.allocated_idle_rows), "idle_slices": len(view.slice_rows),
           "idle_per_hour": round(k.burning_per_hour, 2)}
    want = {"idle_nodes": len(expected["idle_nodes"]), "idle_gpus": expected["idle_gpus"],
            "spinning": len(expected["spinning"]), "throttled": len(expected["throttled"]),
            "starved": len(expected["starved"]), "stragglers": len(expected["stragglers"]),
            "allocated_idle": len(expected["allocated_idle"]),
            "idle_slices": len(expected["idle_slices"]),
            "idle_per_hour": round(expected["idle_per_hour"], 2)}
    return {"got": got, "expected": want,
            "differ": sorted(key for key in got if got[key] != want[key])}


#: What :func:`begin_within` removes of every node (the sparse flags of the idle and
#: allocated-idle verdicts), and of the nodes spinning at the end (the flag and the dense
#: signals it is judged on, so that their steps say the same).
BEGIN_EVERYWHERE = ("idle", "held_idle")
BEGIN_SPINNING = ("spin", "util", "util_max", "sm", "tensor", "dram", "power")


def begin_within(store: Store, meta: dict[str, Any], minutes: float) -> int:
    """Makes the set's idle, allocated-idle and spinning findings begin ``minutes`` before
    the end (their recorded samples before then removed, :meth:`Store.delete_before`; the
    data set itself is untouched: the store runs on a copy). Returns how many nodes spin."""
    end = meta["end"]
    before = end - minutes * 60.0
    spinning = sorted({r["metric"].get("node", "") for r in store.query(
        f"group by (node) (last_over_time({RULES['spin']}[1m]))", end)})
    for key in BEGIN_EVERYWHERE:
        store.delete_before(RULES[key], before)
    for part in range(0, len(spinning), 500):
        names = any_of(spinning[part:part + 500])
        for key in BEGIN_SPINNING:
            store.delete_before(f'{RULES[key]}{{node=~"{names}"}}', before)
    return len(spinning)


def measure(store: Store, meta: dict[str, Any], expected: dict[str, Any],
            args: argparse.Namespace) -> dict[str, Any]:
    end = meta["end"]
    # The 1-minute load average before and after (this machine is shared: a timing is
    # read beside it).
    result: dict[str, Any] = {"store_start_s": round(store.started_s, 2),
                              "load_1m_before": os.getloadavg()[0]}
    if args.began_within is not None:
        result["began_within_min"] = args.began_within
        result["spinning_nodes_cut"] = begin_within(store, meta, args.began_within)
    source = page_source(store.url, meta, args)
    if args.raw:
        # The raw queries even where the recording rules are loaded (their fallback).
        source._check_rules = lambda window: (False, 0)  # type: ignore[method-assign]
    prices = load_prices()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steps")
    fetch, build, render = [], [], []
    # The dashboard's own CPU (this process, every thread: the page's queries are read in a
    # pool) while it fetches and while it analyses: on one machine with the store, the
    # page's wall time is bounded below by the two CPUs together over the cores.
    fetch_cpu, build_cpu = [], []
    shows: list[float] = []  # showback() within each run's analysis (build)
    parts: list[dict[str, float]] = []  # section_times of each run's view
    # Per page, the store's CPU seconds, the garbage collections it completed and the bytes
    # it allocated (read between pages, outside the timings): a page that meets a collection
    # of a big heap is the slow one (docs/benchmarks.md, ninth and tenth passes).
    cpu, go = [store.cpu_seconds()], [store.go_counters()]
    # Per page, what its answers brought: bytes of JSON and series (item 3 of issue 29: what
    # the page receives should not grow with the nodes that have findings).
    received: list[tuple[int, int]] = []
    # The last page's by the role its queries have (``PrometheusStore.answers_by_role``).
    by_role: dict[str, list[int]] = {}
    try:
        with timing(views, "showback", shows):
            for _ in range(args.runs + 1):  # the first run warms the store's caches
                # As DashboardService computes a view: both under one pause of the garbage
                # collector (what it then collects is in the rendering's time).
                with gc_paused():
                    got = (source.answer_bytes_total, source.answer_series_total)
                    roles = {k: list(v) for k, v in source.answers_by_role.items()}
                    t0, p0 = time.perf_counter(), time.process_time()
                    shown = source.window(args.window)
                    steps = pool.submit(source.step_series, registry.step_queries(),
                                        args.window, shown)
                    data = source.fleet(args.window, args.namespace, shown)
                    answers = steps.result()
                    t1, p1 = time.perf_counter(), time.process_time()
                    received.append((source.answer_bytes_total - got[0],
                                     source.answer_series_total - got[1]))
                    by_role = role_counts(roles, source.answers_by_role)
                    view = build_fleet_view(data, prices, None, args.namespace, answers,
                                            args.cluster)
                    queries, runs = data.queries, data.runs
                    del data  # freed before the collector is back on, as the service does
                    t2, p2 = time.perf_counter(), time.process_time()
                heatmap_figure(view.heatmap).to_json()
                json.dumps({f"{k[0]}.{k[1]}": v for k, v in sections.fill(view, {}).items()},
                           default=str)
                t3 = time.perf_counter()
                parts.append(section_times(view))  # again, part by part, outside the timings
                fetch.append(t1 - t0)
                fetch_cpu.append(p1 - p0)
                build_cpu.append(p2 - p1)
                build.append(t2 - t1)
                render.append(t3 - t2)
                cpu.append(store.cpu_seconds())
                go.append(store.go_counters())
        # The showback's query alone, after the pages (the store as warm as for a page).
        result.update(holdings_cost(store, source, args.window, args.runs))
    except DataError as exc:
        result["error"] = str(exc)
        print(f"{store.kind}: the fleet page failed: {exc}", flush=True)
    finally:
        pool.shutdown()
        source.close()
    if "error" not in result:
        k = view.kpis
        print(f"{store.kind}: {k.gpus} GPUs, {k.idle} idle, {k.idle_nodes} idle nodes, "
              f"{len(view.starved_rows)} starved, {len(view.straggler_rows)} stragglers, "
              f"{queries} queries" + (f"; cluster {args.cluster}" if args.cluster else ""))
        # A namespace filter narrows the flags: the fleet's expected ones are the whole's
        # (a cluster's are that cluster's: main() gives them).
        check = (verdicts(view, expected) if args.namespace is None
                 else {"got": {}, "expected": {}, "differ": []})
        totals = showback_totals(view) if args.namespace is None else None
        result.update(
            # The findings the store summarised (with the rules): whole, and from a later step.
            summarised=None if runs is None else {
                "idle": len(runs.idle), "idle_from": len(runs.idle_from),
                "spinning": len(runs.spinning), "spinning_from": len(runs.spinning_from),
                "held_idle": len(runs.held_idle), "held_idle_from": len(runs.held_idle_from),
                "stragglers": len(runs.stragglers)},
            queries_fleet=queries, first_fetch_s=fetch[0],
            # What the last page's answers brought (every page asks the same).
            received_mib=round(received[-1][0] / 2**20, 1), received_series=received[-1][1],
            # ... and by role, the largest first (its bytes, series and answers).
            received_by_role={role: {"mib": round(b / 2**20, 2), "series": n, "answers": a}
                              for role, (b, n, a) in by_role.items()},
            fetch_s=statistics.median(fetch[1:]), analysis_s=statistics.median(build[1:]),
            render_s=statistics.median(render[1:]),
            # The dashboard's CPU seconds a page (median of the runs after the first).
            python_cpu_s={"fetch": round(statistics.median(fetch_cpu[1:]), 3),
                          "analysis": round(statistics.median(build_cpu[1:]), 3)},
            # Each run's whole page: a store's garbage collector makes some pages much
            # slower than the median (docs/benchmarks.md, ninth pass).
            page_s=[round(f + b + r, 3)
                    for f, b, r in zip(fetch[1:], build[1:], render[1:], strict=True)],
            store_cpu_s=[round(b - a, 2) for a, b in itertools.pairwise(cpu[1:])],
            store_collections=[
                None if a.collections is None or b.collections is None
                else b.collections - a.collections for a, b in itertools.pairwise(go[1:])],
            store_alloc_mib=[
                None if a.allocated_bytes is None or b.allocated_bytes is None
                else round((b.allocated_bytes - a.allocated_bytes) / 2**20)
                for a, b in itertools.pairwise(go[1:])],
            verdicts=check["got"],
            # and where the owners do not add up to the page's totals: showback_spent...
            verdicts_differ=check["differ"] + [f"showback_{key}" for key in
                                               (totals["differ"] if totals else [])],
            # showback() alone, a part of the analysis (median of the runs after the first).
            showback_s=round(statistics.median(shows[1:]), 4),
            # Each part of the rendering (the heatmap, every section by id), median of the
            # runs after the first, timed apart from the pages.
            render_parts_s={key: round(statistics.median(p[key] for p in parts[1:]), 4)
                            for key in parts[0]},
        )
        if totals is not None:
            result["showback_totals"] = totals
        if meta.get("cluster_label"):
            result["cluster_label"] = meta["cluster_label"]
        if args.cluster:
            result["cluster"] = args.cluster
        result["load_1m_after"] = os.getloadavg()[0]
        print(f"{store.kind} server side (median of {args.runs}, first {fetch[0]:.2f}s): "
              f"queries {result['fetch_s']:.2f}s, analysis {result['analysis_s']:.2f}s, "
              f"rendering {result['render_s']:.2f}s; load average (1 min) "
              f"{result['load_1m_before']:.2f} before, {result['load_1m_after']:.2f} after; "
              f"whole pages {min(result['page_s']):.2f}-{max(result['page_s']):.2f}s; "
              f"received {result['received_mib']:.1f} MiB of JSON, "
              f"{result['received_series']:,} series a page; the dashboard's CPU "
              f"{result['python_cpu_s']['fetch']:.2f} CPU-s fetching, "
              f"{result['python_cpu_s']['analysis']:.2f} analysing", flush=True)
        print(f"{store.kind} received by role (MiB, series, answers): " + ", ".join(
            f"{role} {v['mib']:.2f} {v['series']:,} {v['answers']}"
            for role, v in list(result["received_by_role"].items())[:10]), flush=True)
        print(f"{store.kind} each page (the store's CPU, collections, allocation): " + ", ".join(
            f"{t:.2f}s ({c:.1f} CPU-s, {'?' if n is None else n} GC, "
            f"{'?' if a is None else a} MiB)" for t, c, n, a in zip(
                result["page_s"], result["store_cpu_s"], result["store_collections"],
                result["store_alloc_mib"], strict=True)), flush=True)
        print(f"{store.kind} rendering by part (median of {args.runs}, timed apart): "
              + ", ".join(f"{key.removeprefix('section-')} {t * 1000:.1f} ms"
                          for key, t in result["render_parts_s"].items()), flush=True)
        print(f"{store.kind} showback (median of {args.runs}): showback() "
              f"{result['showback_s'] * 1000:.1f} ms of the analysis; the holdings queries alone "
              f"{result['holdings_query_s']:.3f}s, {result['holdings_query_cpu_s']:.2f} CPU-s "
              f"of the store, {result['holdings_rows']:,} rows "
              f"({'recorded' if result['holdings_from_rules'] else 'raw'})", flush=True)
        if totals is not None:
            print(f"{store.kind} showback totals ({totals['owners']:,} owners): "
                  + ", ".join(f"{key} {totals[key]['owners']:,.2f} (page {totals[key]['kpi']:,.2f},"
                              f" {totals[key]['difference']:+.2g})"
                              for key in ("spent", "idle", "spinning"))
                  + ("; add up to the cent" if not totals["differ"] else
                     f"; DIFFER: {', '.join(totals['differ'])}"), flush=True)
        if check["differ"]:
            print(f"{store.kind}: verdicts differ from the expected ones: "
                  + ", ".join(f"{key} {check['got'][key]} (expected {check['expected'][key]})"
                              for key in check["differ"]), flush=True)
        if args.drill_downs:
            result.update(drill_downs(store, meta, view, args))
        if not args.no_browser:
            result.update(page_loads(store, meta, args))
    result.update(rss_kib=store.rss_kib(), peak_rss_kib=store.peak_rss_kib(),
                  series=store.series_count(end))
    print(f"{store.kind}: RSS {result['rss_kib'] / 1024:,.0f} MiB after the queries "
          f"(peak {result['peak_rss_kib'] / 1024:,.0f} MiB), {result['series']:,} series",
          flush=True)
    return result


def drill_downs(store: Store, meta: dict[str, Any], view: FleetView,
                args: argparse.Namespace) -> dict[str, Any]:
    """The node, pod and workload drill-downs' queries (``PrometheusData.node_detail``,
    ``pod_detail``, ``workload_detail``), medians of ``--runs`` after a warm-up: of the
    first idle node (else the first node), the middle pod of the picker and the workload
    the page opens with."""
    source = page_source(store.url, meta, args)
    node = view.idle_rows[0].node if view.idle_rows else view.nodes[0]
    namespace, pod = view.pods[len(view.pods) // 2].split("/", 1)
    asks: dict[str, Any] = {"node": lambda: source.node_detail(node, args.window),
                            "pod": lambda: source.pod_detail(namespace, pod, args.window)}
    if view.default_workload:
        wns, workload = view.default_workload.split("/", 1)
        asks["workload"] = lambda: source.workload_detail(wns, workload, args.window)
    out: dict[str, Any] = {}
    try:
        for name, ask in asks.items():
            times = []
            for _ in range(args.runs + 1):
                began = time.perf_counter()
                ask()
                times.append(time.perf_counter() - began)
            out[f"{name}_detail_s"] = statistics.median(times[1:])
    finally:
        source.close()
    print(f"{store.kind} drill-downs (median of {args.runs}): "
          + ", ".join(f"{k.removesuffix('_detail_s')} {v:.3f}s" for k, v in out.items()),
          flush=True)
    return out


def load_query(window: float, cluster: str | None, namespace: str | None = None) -> str:
    """The browser load's query string: the view the server-side pages measure, the set's
    window where it is not the default hour (``?window=6h``), the namespace filter
    (``?namespace=``) and the cluster (``?cluster=``); empty for the default view.
    ``SystemExit`` for a window the page does not offer."""
    from gpuscope.dashboard.service import WINDOWS

    params = {}
    if window != 3600.0:
        names = [name for name, seconds in WINDOWS.items() if seconds == window]
        if not names:
            raise SystemExit(f"the page offers no {window:g}-s window: no browser load "
                             "(or pass --no-browser)")
        params["window"] = names[0]
    if namespace:
        params["namespace"] = namespace
    if cluster:
        params["cluster"] = cluster
    return f"?{urllib.parse.urlencode(params)}" if params else ""


def page_loads(store: Store, meta: dict[str, Any], args: argparse.Namespace
               ) -> dict[str, Any]:
    from gpuscope.dashboard.app import DashboardServer, create_app
    from gpuscope.dashboard.service import DashboardService

    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} not found: apt-get install chromium "
                         "(or pass --no-browser)")
    out: dict[str, Any] = {}
    # A view other than the default one is computed on demand: the service keeps warm the
    # default view alone.
    query = load_query(args.window, args.cluster, args.namespace)
    for mode in ("on_demand",) if query else ("on_demand", "kept_warm"):
        source = page_source(store.url, meta, args)
        service = DashboardService(source, load_prices(), share_for=0)
        if mode == "kept_warm":
            service.keep_warm(30.0)
            service.fleet(None, None)  # the first background result is in
        app = create_app(service, refresh_seconds=3600)
        server = DashboardServer(app, "127.0.0.1", 0)
        server.start()
        try:
            before = source.queries_total
            loads = browser_load(f"http://127.0.0.1:{server.port}/{query}", args.runs + 1,
                                 filtered=bool(args.namespace), store_cpu=store.cpu_seconds)
            per_load = (source.queries_total - before) / len(loads)
        finally:
            server.stop()
            service.close()
            source.close()
        totals = [load.total for load in loads]
        drivers = [load.driver or load.total for load in loads]
        answers = [(a.answer, a.answer_bytes or 0) for a in loads[1:] if a.answer is not None]
        answer = statistics.median(t for t, _ in answers) if answers else None
        size = statistics.median(b for _, b in answers) if answers else None
        out.update({f"page_load_{mode}_first_s": totals[0],
                    f"page_load_{mode}_s": statistics.median(totals[1:]),
                    f"page_loads_{mode}_s": [round(t, 3) for t in totals[1:]],
                    f"page_load_{mode}_driver_s": statistics.median(drivers[1:]),
                    f"page_load_{mode}_answer_s": answer,
                    f"page_load_{mode}_answer_bytes": size,
                    **{f"page_load_{mode}_{who}_cpu_s": statistics.median(
                        getattr(load, f"{who}_cpu") or 0.0 for load in loads[1:])
                       for who in ("chromium", "own", "store")},
                    f"queries_per_page_load_{mode}": per_load})
        drawn = (f"; the fleet answer in at {answer:.2f}s ({(size or 0) / 1024:,.0f} KiB), "
                 f"drawn {statistics.median(totals[1:]) - answer:.2f}s later (medians)"
                 if answer is not None else "")
        print(f"{store.kind} page load in Chromium, view {mode.replace('_', ' ')}: first "
              f"{totals[0]:.2f}s, then median {statistics.median(totals[1:]):.2f}s "
              f"({min(totals[1:]):.2f}-{max(totals[1:]):.2f}s){drawn}; "
              f"Playwright saw it drawn at {statistics.median(drivers[1:]):.2f}s (median); "
              f"{per_load:g} queries per page load; a load's CPU (medians): Chromium "
              f"{out[f'page_load_{mode}_chromium_cpu_s']:.2f}s, this process (the dashboard) "
              f"{out[f'page_load_{mode}_own_cpu_s']:.2f}s, the store "
              f"{out[f'page_load_{mode}_store_cpu_s']:.2f}s", flush=True)
    return out


@contextmanager
def head_prometheus(head: Path, env: dict[str, str] | None) -> Iterator[Store]:
    """Prometheus on a copy of a head folder (WAL and head chunks: Prometheus appends to them
    when it starts, so a hard-linked copy would change the kept data set); it replays the WAL
    before it answers ready (about 15 s at 5,000 nodes)."""
    with tempfile.TemporaryDirectory(prefix="gpuscope-head-") as tmp:
        shutil.copytree(head, Path(tmp) / "tsdb")
        with start_prometheus(Path(tmp) / "tsdb", copy=False, env=env, timeout=600) as store:
            yield store


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--step", type=float, default=SCRAPE,
                    help="seconds between samples (default 15)")
    ap.add_argument("--window", type=float, default=3600.0, help="seconds (default 1 h)")
    ap.add_argument("--store", choices=sorted(STORES), default="prometheus")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0, help="per query, seconds")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--namespace", help="the fleet page filtered to this namespace")
    ap.add_argument("--cluster", help="the fleet page scoped to this cluster (the cluster "
                    "picker; a set built with bench/fleet.py --clusters), its verdicts "
                    "compared with that cluster's expected ones")
    ap.add_argument("--drill-downs", action="store_true",
                    help="also time the node, pod and workload drill-downs")
    ap.add_argument("--raw", action="store_true",
                    help="the raw queries even where the recording rules are loaded")
    ap.add_argument("--records", action="store_true",
                    help="read the idle and allocated-idle findings from the verdicts' run "
                    "records where they cover the page's history (PrometheusData."
                    "read_records; a set built by bench/rules.py with the runs)")
    ap.add_argument("--no-summaries", action="store_true",
                    help="ask every finding's steps even where the recording rules summarise "
                    "it whole (the sets' findings hold over the whole window; a fleet whose "
                    "findings began within it sends their steps)")
    ap.add_argument("--began-within", type=float, metavar="MINUTES",
                    help="with the recording rules: the idle, spinning and allocated-idle "
                    "findings made to begin MINUTES before the window's end (their earlier "
                    "samples removed in the store's copy of the set)")
    ap.add_argument("--no-cache", action="store_true",
                    help="VictoriaMetrics with -search.disableCache: every run computed anew "
                    "(its response cache answers a repeated range query with the same end)")
    ap.add_argument("--keep", help="keep the generated data in this folder, and reuse it "
                    "when it is already there (same --nodes, --step and --window)")
    ap.add_argument("--store-gogc", type=int, metavar="PERCENT",
                    help="the store's Go garbage collector target (GOGC; Go's default 100): "
                    "both stores are Go programs, and Prometheus 2.42 spends much of a "
                    "5,000-node page in its collector (docs/benchmarks.md, ninth pass)")
    ap.add_argument("--head", action="store_true",
                    help="Prometheus on the data set's head/ (bench/head.py: the hour in its "
                    "head, as a running Prometheus holds it) instead of its blocks")
    ap.add_argument("--data", help="a data set bench/fleet.py built (e.g. $SETS/f57): "
                    "use it as it is (--nodes, --step and --window are its own)")
    args = ap.parse_args()
    if (args.nodes < 1 or args.step <= 0 or args.window < args.step or args.runs < 1
            or (args.store_gogc is not None and args.store_gogc < 1)):
        print("dashboard_bench: --nodes, --runs and --store-gogc must be >= 1, --step > 0 "
              "and --window >= --step", file=sys.stderr)
        return 2
    stores = STORES[args.store]
    if args.head and (stores != ("prometheus",) or not args.data):
        print("dashboard_bench: --head needs --data and --store prometheus", file=sys.stderr)
        return 2
    try:
        folder, meta, temporary = data_set(args, stores)
    except StoreError as exc:
        print(f"dashboard_bench: {exc}", file=sys.stderr)
        return 1
    if args.data:
        args.nodes, args.step, args.window = meta["nodes"], meta["step"], meta["window"]
    if args.began_within is not None and not 0 < args.began_within * 60 < args.window:
        print("dashboard_bench: --began-within must be more than 0 and less than the window "
              "(minutes)", file=sys.stderr)
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
        return 2
    expected = json.loads((folder / "expected.json").read_text())
    if args.cluster is not None:
        try:
            expected = cluster_expected(meta, validate_cluster(args.cluster))
        except ValueError as exc:
            print(f"dashboard_bench: --cluster: {exc}", file=sys.stderr)
            if temporary:
                shutil.rmtree(folder, ignore_errors=True)
            return 2
    result: dict[str, Any] = {"nodes": meta["nodes"], "clusters": meta.get("clusters", 1),
                              "gpus": meta["gpus"],
                              "step_s": meta["step"], "window_s": meta["window"],
                              "series": meta["series"], "samples": meta["samples"],
                              "data": str(folder)}
    if args.no_summaries:
        result["no_summaries"] = True
    env = {"GOGC": str(args.store_gogc)} if args.store_gogc is not None else None
    if env:
        result["store_gogc"] = args.store_gogc
    try:
        for kind in stores:
            store_cm = (head_prometheus(folder / "head", env) if args.head else
                        start_prometheus(folder / "tsdb", env=env) if kind == "prometheus" else
                        start_victoriametrics(folder / "vm", cache=not args.no_cache, env=env))
            with store_cm as store:
                result[kind] = measure(store, meta, expected, args)
            if kind == "prometheus" and not args.head:
                # A window across a block range's boundary costs Prometheus about twice the
                # same window inside one (docs/benchmarks.md, eleventh pass): say which.
                ranges = fleet.block_ranges(folder / "tsdb", meta["end"] - args.window,
                                            meta["end"])
                result[kind]["block_ranges"] = ranges
                print(f"prometheus: the window lies in {ranges} of the blocks' 2-hour ranges",
                      flush=True)
    except StoreError as exc:
        print(f"dashboard_bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result))
    return 0


__all__ = ["SCRAPE", "free_port", "openmetrics", "wait_http"]

if __name__ == "__main__":
    sys.exit(main())
