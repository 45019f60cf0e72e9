"""Glue between the page and the data: validates filters, runs the views, and keeps the
last good answer so a slow or unreachable backend shows a banner over the last data
instead of an error page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data import (
    DataError,
    DataSource,
    InvalidFilter,
    validate_cluster,
    validate_namespace,
    validate_workload,
)
from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.prices import PriceTable
from gpuscope.dashboard.series import GpuRef, NodeDetail, PodDetail, WorkloadDetail, gc_paused
from gpuscope.dashboard.verdicts import Thresholds, registry
from gpuscope.dashboard.verdicts.owners import RunTotals, run_totals
from gpuscope.dashboard.verdicts.page import StepAnswers
from gpuscope.dashboard.views import FleetView, build_fleet_view, with_details

log = logging.getLogger(__name__)

WINDOWS: dict[str, float] = {
    "15m": 15 * 60.0,
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 86400.0,
    "7d": 7 * 86400.0,
}
DEFAULT_WINDOW = "1h"


@dataclass(frozen=True, slots=True)
class Answer:
    """A view (possibly an older one) and a banner explaining what went wrong, if anything."""

    view: FleetView | None
    banner: str | None = None
    fetched_at: float | None = None


def _with_problems(fut: Future[Answer], problems: list[str]) -> Future[Answer]:
    """``fut``'s answer with ``problems`` put in front of its banner."""
    out: Future[Answer] = Future()

    def done(f: Future[Answer]) -> None:
        try:
            answer = f.result()
        except BaseException as exc:  # pragma: no cover - _compute never raises
            out.set_exception(exc)
            return
        banner = " ".join([*problems, *([answer.banner] if answer.banner else [])])
        out.set_result(Answer(answer.view, banner or None, answer.fetched_at))

    fut.add_done_callback(done)
    return out


class ReadFailed(str):
    """A drill-down's problem that is a failure to read it (the store unreachable, slow or
    answering an error; a bug), not an answer about what was picked (nothing there, not a
    name): the page keeps the charts it last drew under it, as the fleet view keeps its
    last data under the page's banner."""

    __slots__ = ()


def window_seconds(key: str | None) -> float:
    return WINDOWS.get(key or DEFAULT_WINDOW, WINDOWS[DEFAULT_WINDOW])


#: A view's key: window, namespace (None: all), cluster (None: all).
Key = tuple[str, str | None, str | None]

# Views kept per (window, namespace): every distinct namespace typed into the filter is a
# key, so the caches are bounded (oldest out) to keep a long-running dashboard's memory flat.
MAX_CACHED_VIEWS = 32

# How long a view computed for a page request waits for that page's first callback, seconds
# after it finished. The browser loads the page's scripts in between: half a second on a
# quiet desk, several seconds on a busy laptop or a slow link. Past the ordinary two-second
# sharing, the first callback still takes it (once), instead of running every query again.
PREFETCH_KEPT_S = 30.0

# How old a finished view the workload view takes, seconds. It reads only the fleet view's
# default workload and straggler marks, and its callback can come a few seconds after the
# fleet callback's (they chain on the page's pickers); it should not run the fleet's queries
# again for that. Well under the 30 s refresh, so a refresh still brings fresh marks.
WORKLOAD_REUSES_S = 10.0


@dataclass(slots=True)
class _Shared:
    """A computation that requests for one key share: when it finished (monotonic seconds),
    and whether it was started for a page whose callback has not yet come for it."""

    future: Future[Answer] = field(default_factory=Future)
    finished: float | None = None
    prefetched: bool = False

    def age(self, now: float) -> float | None:
        """Seconds since the answer was ready; ``None`` while it is still computing."""
        if self.finished is None or not self.future.done():
            return None
        return now - self.finished


def _key(window: str | None, namespace_text: str | None, cluster_text: str | None = None
         ) -> tuple[Key, list[str]]:
    """A view's key (window; namespace and cluster: None for all or for a filter that is
    not a valid name), and the lines the page shows about such filters."""
    problems: list[str] = []
    namespace = cluster = None
    if namespace_text and namespace_text.strip():
        try:
            namespace = validate_namespace(namespace_text)
        except InvalidFilter as exc:
            problems.append(f"Namespace filter ignored: {exc}.")
    if cluster_text and cluster_text.strip():
        try:
            cluster = validate_cluster(cluster_text)
        except ValueError as exc:
            problems.append(f"Cluster filter ignored: {exc}.")
    return (window or DEFAULT_WINDOW, namespace, cluster), problems


def describe(of: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """A view in words, as a banner over another view's data says it (``node n1, the 1h
    window, namespace ml``): ``of``'s parts in their order (a node, pod or workload, the
    window, the namespace and cluster), its namespace and cluster said where either it or
    ``other`` has one. Values not a non-empty string (JSON from the page) count as none."""
    words = []
    for key, value in of.items():
        value = value if isinstance(value, str) and value else None
        if key == "window":
            words.append(f"the {value or DEFAULT_WINDOW} window")
        elif key in ("namespace", "cluster"):
            if value or other.get(key):
                words.append(f"{key} {value}" if value else f"every {key}")
        elif value:
            words.append(f"{key} {value}")
    return ", ".join(words)


def _parts(key: Key) -> dict[str, str | None]:
    window, namespace, cluster = key
    return {"window": window, "namespace": namespace, "cluster": cluster}


class DashboardService:
    """Computes fleet views, one computation per (window, namespace, cluster) at a time: requests
    that arrive while one is running (several browsers, or the page load's prefetch and
    its first callback) share it, and a result finished less than ``share_for`` seconds ago
    is reused. A result computed for a page request is also kept for that page's first
    callback, up to :data:`PREFETCH_KEPT_S` seconds after it finished.
    """

    def __init__(
        self,
        source: DataSource,
        prices: PriceTable,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.time,
        share_for: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` stamps answers (wall seconds, shown on the page); ``monotonic`` ages
        shared computations (seconds)."""
        self.source = source
        self.prices = prices
        self.thresholds = thresholds or Thresholds()
        self._clock = clock
        self._monotonic = monotonic
        self._share_for = share_for
        self._lock = threading.Lock()
        self._last: dict[Key, tuple[FleetView, float]] = {}
        self._last_any: tuple[FleetView, float, Key] | None = None
        self._inflight: dict[Key, _Shared] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleet-view")
        self._steps_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="step-queries")
        self._warm_key: Key | None = None
        self._warm_every = 0.0
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._steps_pool.shutdown(wait=False, cancel_futures=True)

    def keep_warm(self, every: float, window: str = DEFAULT_WINDOW) -> None:
        """Recompute the default view (``window``, all namespaces) every ``every`` seconds in
        the background, so page loads and auto-refreshes of that view read a result at most
        ``every`` seconds old instead of waiting for the queries. One computation per
        interval serves every browser."""
        self._warm_key = (window, None, None)
        self._warm_every = every

        def loop() -> None:
            while not self._stop.is_set():
                began = time.monotonic()
                with self._lock:
                    found = self._inflight.get((window, None, None))
                    if found is None or found.future.done():
                        fut = self._submit((window, None, None)).future
                    else:
                        fut = found.future
                try:
                    fut.result()
                except Exception:  # pragma: no cover - _compute never raises
                    log.exception("background refresh failed")
                self._stop.wait(max(0.0, every - (time.monotonic() - began)))

        threading.Thread(target=loop, name="fleet-view-warm", daemon=True).start()

    def prefetch(self, window: str | None = None, namespace_text: str | None = None,
                 cluster_text: str | None = None) -> None:
        """Start computing a view the page is about to ask for (the page load calls this,
        so the queries run while the browser is still loading scripts)."""
        self._shared(window, namespace_text, cluster_text, prefetch=True)

    def fleet(self, window: str | None, namespace_text: str | None,
              cluster_text: str | None = None) -> Answer:
        return self._shared(window, namespace_text, cluster_text, claim=True).result()

    def now(self) -> float:
        """The wall clock the service stamps answers with (seconds): when a drill-down was
        drawn, said where the page keeps it over a failed read."""
        return self._clock()

    @staticmethod
    def view_key(window: str | None, namespace_text: str | None,
                 cluster_text: str | None = None) -> Key:
        """The view a page's controls name: window, namespace and cluster (None: all, or a
        filter that is not a name, which the page ignores)."""
        return _key(window, namespace_text, cluster_text)[0]

    def latest(self, window: str | None, namespace_text: str | None,
               cluster_text: str | None = None) -> FleetView | None:
        """The last view computed for this window, namespace and cluster (what the page
        shows), or None: never a new computation (a table's "show all" and its CSV read
        it)."""
        key, _ = _key(window, namespace_text, cluster_text)
        with self._lock:
            found = self._last.get(key)
        return found[0] if found is not None else None

    def detailed(self, view: FleetView, table_id: str, first: int, window: str | None,
                 namespace_text: str | None, cluster_text: str | None = None) -> FleetView:
        """``view`` (of this window, namespace and cluster) with what the first ``first``
        rows of its table ``table_id`` need read from the store read
        (:func:`~gpuscope.dashboard.views.with_details`: a straggler's evidence, a
        summarised spinning run's signals), kept in its place as the latest view so that it
        is read once. A store that fails leaves
        those rows unread (they say so), and is logged."""
        key, _ = _key(window, namespace_text, cluster_text)
        with self._lock:
            found = self._last.get(key)
        if (found is not None and view.row_details
                and found[0].row_details is view.row_details):
            # The same computation, with what was read for it already (a refresh that
            # shares the view reads nothing again).
            view = found[0]
        out, problem = with_details(view, table_id, first)
        if problem:
            log.warning("%s", problem)
        if out is view:
            return view
        with self._lock:
            found = self._last.get(key)
            if found is not None and found[0] is view:
                self._last[key] = (out, found[1])
        return out

    def _shared(
        self, window: str | None, namespace_text: str | None, cluster_text: str | None = None,
        *, prefetch: bool = False, claim: bool = False, reuse_for: float = 0.0,
    ) -> Future[Answer]:
        """The computation of this view to wait for: one running, one finished recently
        enough (``share_for``, or ``reuse_for`` where longer), the one kept for a page's first
        callback (which the fleet callback, ``claim``, takes), or a new one."""
        key, problems = _key(window, namespace_text, cluster_text)
        now = self._monotonic()
        with self._lock:
            found = self._inflight.get(key)
            if found is not None:
                share_for = max(reuse_for, self._warm_every * 1.5 + 5.0
                                if key == self._warm_key else self._share_for)
                age = found.age(now)
                kept = found.prefetched and claim and (age or 0.0) < PREFETCH_KEPT_S
                if age is None or age < share_for or kept:
                    if kept:
                        found.prefetched = False  # the page's first callback took it
                    found.prefetched |= prefetch
                    if not problems:
                        return found.future
                    # Same data; this request's own filter problem goes on its banner.
                    return _with_problems(found.future, problems)
            shared = self._submit(key)
            shared.prefetched = prefetch
            self._trim_inflight()
        fut = shared.future
        return _with_problems(fut, problems) if problems else fut

    def _submit(self, key: Key) -> _Shared:
        """Start computing ``key``'s view (called with the lock held)."""
        shared = _Shared()

        def compute() -> Answer:
            answer = self._compute(key, [])
            # Recorded before the future is done, so a finished answer always has its age.
            shared.finished = self._monotonic()
            return answer

        shared.future = self._pool.submit(compute)
        self._inflight.pop(key, None)  # re-inserted last: the dict's order is the age order
        self._inflight[key] = shared
        return shared

    def _trim_inflight(self) -> None:
        """Forget finished computations, oldest first, beyond :data:`MAX_CACHED_VIEWS`
        (running ones and the kept-warm view stay). Called with the lock held."""
        excess = len(self._inflight) - MAX_CACHED_VIEWS
        for key in [k for k, shared in self._inflight.items()
                    if shared.future.done() and k != self._warm_key][:max(0, excess)]:
            del self._inflight[key]

    def _compute(self, key: Key, problems: list[str]) -> Answer:
        window, namespace, cluster = key
        try:
            # One pause of the garbage collector for both (each holds it off on its own):
            # the collection that follows a pause walks every object made in it, once.
            with gc_paused():
                # The registry's step queries go out beside the fleet's, over the same
                # window (a failure there costs their sections, not the page).
                seconds = window_seconds(window)
                shown = self.source.window(seconds)
                steps = self._steps_pool.submit(self.source.step_series,
                                                registry.step_queries(self.thresholds),
                                                seconds, shown)
                data = self.source.fleet(seconds, namespace, shown)
                view = build_fleet_view(data, self.prices, self.thresholds, namespace,
                                        self._step_answers(steps, problems), cluster)
                # Freed while the collector is still off: the collection that follows
                # then walks the view alone, not the page's 10^6 objects of data as well
                # (0.1 s at 5,000 nodes, docs/benchmarks.md).
                del data
        except DataError as exc:
            return self._fallback(key, [*problems, f"{exc}."])
        except Exception as exc:  # never a traceback page
            log.exception("building the fleet view failed")
            return self._fallback(key, [*problems, f"Internal error: {type(exc).__name__}: {exc}"])
        now = self._clock()
        with self._lock:
            self._last.pop(key, None)  # re-inserted last: the dict's order is the age order
            self._last[key] = (view, now)
            while len(self._last) > MAX_CACHED_VIEWS:
                del self._last[next(iter(self._last))]
            self._last_any = (view, now, key)
        return Answer(view, " ".join(problems) or None, now)

    @staticmethod
    def _step_answers(pending: Future[Any], problems: list[str]) -> StepAnswers:
        """The step queries' answers, or none (and a line in ``problems``) when the store
        failed them."""
        try:
            answers: StepAnswers = pending.result()
            return answers
        except DataError as exc:
            problems.append(f"GPU health and the other registry verdicts unavailable: {exc}.")
        except Exception as exc:
            log.exception("the registry's step queries failed")
            problems.append(f"GPU health unavailable: internal error: {type(exc).__name__}.")
        return {}

    def _fallback(self, key: Key, problems: list[str]) -> Answer:
        with self._lock:
            mine = self._last.get(key)
            found = (*mine, key) if mine is not None else self._last_any
        if found is None:
            return Answer(None, " ".join([*problems, "No data yet."]))
        view, at, shown = found
        # Another view's data (the window or a filter changed while the store is down): the
        # page's controls name one view, its numbers are another's; the banner says which.
        asked, drawn = _parts(key), _parts(shown)
        which = "" if shown == key else (f", of {describe(drawn, asked)}, "
                                         f"not {describe(asked, drawn)}")
        return Answer(view, " ".join([*problems,
                                      f"Showing the last data, from {fmt.clock(at)}{which}."]),
                      at)

    def node(self, node: str | None, window: str | None) -> tuple[NodeDetail | None, str | None]:
        if not node:
            return None, None
        try:
            detail = self.source.node_detail(node, window_seconds(window))
        except InvalidFilter as exc:
            return None, str(exc)
        except DataError as exc:
            return None, ReadFailed(exc)
        except Exception as exc:
            log.exception("node drill-down failed")
            return None, ReadFailed(f"Internal error: {type(exc).__name__}: {exc}")
        if detail.empty:
            return None, (f"No GPU data for node {node!r} in the last "
                          f"{fmt.duration(window_seconds(window))}: not a node this dashboard "
                          f"knows, or one gone for longer than the window.")
        return detail, None

    def workload(
        self, workload: str | None, window: str | None, namespace_text: str | None = None,
        cluster_text: str | None = None,
    ) -> tuple[WorkloadDetail | None, dict[GpuRef, str], str | None]:
        """The workload view: ``workload`` (``namespace/Kind/name``) or, when none is picked,
        the fleet view's default (the first straggler's workload); with the GPUs to mark as
        stragglers (and their kind), or a problem."""
        answer = self._shared(window, namespace_text, cluster_text,
                              reuse_for=WORKLOAD_REUSES_S).result()
        view = answer.view
        chosen = workload or (view.default_workload if view is not None else None)
        if not chosen:
            return None, {}, None
        namespace, _, name = chosen.partition("/")
        # The page's cluster; with every cluster shown, the default is its straggler's run
        # (a job of one name in two clusters is two runs), one picked by name every
        # cluster's run of that name.
        cluster = view.cluster if view else None
        if cluster is None and not workload and view is not None:
            cluster = view.default_workload_cluster
        marks = {
            GpuRef(r.node, r.uuid): r.kind for r in (view.straggler_rows if view else ())
            if r.namespace == namespace and r.workload == name
            and (cluster is None or node_parts(r.node)[0] == cluster)
        }
        try:
            if not name:  # a link without its namespace: name what it gave
                raise InvalidFilter(f"not a workload (namespace/Kind/name): {chosen[:80]!r}")
            validate_workload(name)
            detail = self.source.workload_detail(namespace, name, window_seconds(window),
                                                 first=set(marks), cluster=cluster)
            return detail, marks, None
        except InvalidFilter as exc:
            return None, {}, str(exc)
        except DataError as exc:
            return None, {}, ReadFailed(exc)
        except Exception as exc:
            log.exception("workload view failed")
            return None, {}, ReadFailed(f"Internal error: {type(exc).__name__}: {exc}")

    def run_totals(self, detail: WorkloadDetail, window: str | None,
                   namespace_text: str | None = None, cluster_text: str | None = None
                   ) -> RunTotals | None:
        """The workload's own numbers in the view the page shows (never a new
        computation): its owners' GPU-hours and $, its stragglers, when it was seen."""
        view = self.latest(window, namespace_text, cluster_text)
        if view is None:
            return None
        # Of the clusters whose run ``detail`` draws (one, where the view opened with a
        # straggler's run while every cluster is shown).
        drawn = {node_parts(d.ref.node)[0] for d in detail.devices}

        def ours(node: str) -> bool:
            return not drawn or node_parts(node)[0] in drawn

        stragglers = sum(1 for r in view.straggler_rows
                         if (r.namespace, r.workload) == (detail.namespace, detail.workload)
                         and ours(r.node))
        owners = [o for o in view.owners if not drawn or o.cluster in drawn]
        return run_totals(owners, detail.namespace, detail.workload, stragglers,
                          detail.utilization.values(), view.window.step,
                          max(view.history_start, view.window.start))

    def pod(self, pod: str | None, window: str | None, cluster_text: str | None = None
            ) -> tuple[PodDetail | None, str | None]:
        """The pod drill-down (``namespace/pod``), of the picked cluster where one is."""
        if not pod:
            return None, None
        namespace, _, name = pod.partition("/")
        (_, _, cluster), _ = _key(window, None, cluster_text)  # None: none, or not a name
        try:
            return self.source.pod_detail(namespace, name, window_seconds(window),
                                          cluster), None
        except InvalidFilter as exc:
            return None, str(exc)
        except DataError as exc:
            return None, ReadFailed(exc)
        except Exception as exc:
            log.exception("pod drill-down failed")
            return None, ReadFailed(f"Internal error: {type(exc).__name__}: {exc}")
