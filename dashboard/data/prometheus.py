"""``--prometheus URL``: any Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, ...).

The store: instant and range queries, the registry's step queries (:mod:`.steps`) and the
drill-downs (a node, a pod, a workload). The fleet page's own plan of queries is above the
verdicts, in :mod:`gpuscope.dashboard.plan`. Every aggregation happens server-side
(``max by``, ``avg_over_time`` ... per step, one point per step and series), so a fleet of
thousands of GPUs costs a fixed handful of queries of bounded size. User input reaches PromQL
only validated *and* escaped (:mod:`.promql`)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypedDict

import msgspec

from gpuscope.dashboard.data.http import PromApi, reject_credentials_in_url
from gpuscope.dashboard.data.promql import (
    GROUP_CLUSTER,
    any_of,
    duration,
    node_equal,
    node_key,
    node_matchers,
    scoped,
    selector,
    summed_rate,
)
from gpuscope.dashboard.data.reduce import slice_holder_lines
from gpuscope.dashboard.data.source import (
    DataError,
    make_window,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.data.steps import STEP_LABEL, StepQuery, combined, slices_promql
from gpuscope.dashboard.data.steps import promql as step_promql
from gpuscope.dashboard.series import (
    ContainerRef,
    GpuRef,
    NodeDetail,
    PodDetail,
    Series,
    Window,
    WorkloadDetail,
    WorkloadDevice,
    pick_devices,
)

# -- Prometheus ------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]

#: A step's window: its ``step`` seconds less a millisecond. Prometheus 2 takes the samples
#: of ``[t - d, t]`` (both ends), VictoriaMetrics those of ``(t - d, t]``: a sample exactly
#: on the step before would count twice on one store and once on the other.
EDGE = 0.001
#: The label under which a store holding several clusters keeps each series' cluster (an
#: external label: Thanos, Mimir, Amazon Managed Prometheus, VictoriaMetrics), as
#: kubernetes-mixin's ``clusterLabel``; ``--cluster-label`` names another.
CLUSTER_LABEL = "cluster"

class _RangeSeries(TypedDict):
    metric: dict[str, str]
    values: list[tuple[float, float]]


class _RangeData(TypedDict):
    resultType: str
    result: list[_RangeSeries]


class _RangeAnswer(TypedDict, total=False):
    status: str
    data: _RangeData
    error: str


class _InstantSample(TypedDict):
    metric: dict[str, str]
    value: tuple[float, float]


class _InstantData(TypedDict):
    resultType: str
    result: list[_InstantSample]


class _InstantAnswer(TypedDict, total=False):
    status: str
    data: _InstantData
    error: str


def _decoder(shape: Any) -> Callable[[bytes], Any]:
    """A JSON decoder for answers of ``shape`` (msgspec, a dependency already): the numbers
    Prometheus sends as strings become floats as they are read, five times as fast as
    ``json.loads`` and a ``float()`` each (a fleet page reads millions). An answer of
    another shape (an error, ``+Inf``, which msgspec does not read as a float) is read by
    ``json.loads``, as before."""
    typed = msgspec.json.Decoder(shape, strict=False)

    def decode(raw: bytes) -> Any:
        try:
            return typed.decode(raw)
        except msgspec.MsgspecError:
            return json.loads(raw)

    return decode


#: What reading an answer of another shape raises (a label set that is not an object, a
#: point that is not a pair, a value that is not a number): one line, never a traceback.
_MALFORMED = (TypeError, KeyError, ValueError, AttributeError, IndexError)

_DECODE_RANGE = _decoder(_RangeAnswer)
_DECODE_INSTANT = _decoder(_InstantAnswer)


def _labels(metric: dict[str, str]) -> dict[str, str]:
    # Aggregations drop the name: most answers' label dicts (fresh from the decoder) are
    # kept as they are.
    if "__name__" not in metric:
        return metric
    return {k: v for k, v in metric.items() if k != "__name__"}


def _rate(metric: str, r: str, match: Mapping[str, str] | None = None,
          by: str = "node, gpu, uuid") -> str:
    """Per step, the mean rate of a counter (the mean of the activity it integrates,
    :func:`~gpuscope.dashboard.data.promql.summed_rate`: each exporter pod's, summed, so
    that a rollout does not read the device low for a step), from the steps at which the
    series is at least ``r`` old: before, Prometheus divides what little increase there is
    by all of ``r`` and the rate reads low (a busy GPU would look idle, a working one
    spinning), so those steps are left out. "Old" is any sample in the ``r`` before
    ``t - r`` (``max_over_time``), not the one an instant selector finds at ``t - r``: a
    failed scrape's staleness marker hides that one, and the step two ranges later had no
    rate (a gap that began every spinning and straggler run again)."""
    sel = selector(metric, match)
    return (f"({summed_rate(sel, r, by)} and on ({by})"
            f" max by ({by}) (max_over_time({sel}[{r}] offset {r})))")


def _util_step(r: str, match: Mapping[str, str] | None = None, by: str = "node, gpu, uuid"
               ) -> str:
    """Per step, mean utilization: ``rate(gpu_busy_seconds_total)``, else (an exporter
    without the busy counter; not a counter too young for the range) the gauge's mean."""
    util = selector("gpu_utilization_ratio", match)
    busy = selector("gpu_busy_seconds_total", match)
    return (f"({_rate('gpu_busy_seconds_total', r, match, by)}"
            f" or (max by ({by}) (avg_over_time({util}[{r}])) unless on (node, uuid) {busy}))")


def _power_step(r: str, match: Mapping[str, str] | None = None, by: str = "node, gpu, uuid"
                ) -> str:
    """Per step, mean power in watts: ``rate(gpu_energy_joules_total)``, else (no energy
    counter) the gauge's."""
    power = selector("gpu_power_watts", match)
    energy = selector("gpu_energy_joules_total", match)
    return (f"({_rate('gpu_energy_joules_total', r, match, by)}"
            f" or (max by ({by}) (avg_over_time({power}[{r}]))"
            f" unless on (node, uuid) {energy}))")


def _gref(lab: Mapping[str, str]) -> GpuRef:
    return GpuRef(lab.get("node", ""), lab.get("uuid", ""))


def _cref(lab: Mapping[str, str]) -> ContainerRef:
    return ContainerRef(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""),
                        lab.get("container", ""), lab.get("uuid", ""))


#: The longest query the fleet page sends with node lists, in bytes: VictoriaMetrics refuses
#: queries over 16 KB (``-search.maxQueryLen``); a longer list is split over several queries
#: of the same shape.
MAX_QUERY_BYTES = 12_000


def _split(names: Sequence[str], build: Callable[[Sequence[str]], str],
           limit: int = MAX_QUERY_BYTES) -> list[str]:
    """``build(part)`` for parts of ``names`` (in order) small enough that each query is at
    most ``limit`` bytes (halving a part until it is, down to one name)."""
    if not names:
        return []
    query = build(names)
    if len(query.encode()) <= limit or len(names) == 1:
        return [query]
    half = len(names) // 2
    return _split(names[:half], build, limit) + _split(names[half:], build, limit)


def index_queries(nodes: Collection[str], cluster: str = CLUSTER_LABEL,
                  within: float | None = None) -> list[str]:
    """Each device's index and model (``gpu_info``) on ``nodes`` (node keys; ``cluster``:
    the store's cluster label), in ``node=~`` lists: Prometheus looks the nodes up in its
    index, where a join with ``gpu_info`` reads every device's series of the fleet (33,400
    at 5,000 nodes: most of a drill-down's time from Prometheus' head,
    docs/benchmarks.md). ``within``: of every device there in the last ``within`` seconds
    (a drill-down's window: a node gone before its end still has its devices' index), not
    only of those there at the query's instant."""
    def build(names: Sequence[str]) -> str:
        info = selector("gpu_info", node_matchers(names, cluster))
        if within is not None:
            info = f"last_over_time({info}[{duration(within)}])"
        return f"max by (node, uuid, gpu, model) ({info})"

    return _split(sorted(set(nodes)), build)


class PrometheusStore:
    """Range and instant queries against a Prometheus-compatible API: the store under the
    fleet page (:class:`gpuscope.dashboard.plan.PrometheusData`), the registry's step
    queries and the drill-downs.

    ``min_step``/``max_points`` bound the resolution (points per series); ``lookback`` is
    the shortest range a per-step ``*_over_time`` looks back over, so a step shorter than the
    scrape interval still finds a sample. ``timeout`` applies to each query; the fleet
    page's queries run concurrently.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        min_step: float = 15.0,
        max_points: int = 60,
        lookback: float = 60.0,
        clock: Callable[[], float] = time.time,
        workers: int = 8,
        client: PromApi | None = None,
        cluster_label: str = CLUSTER_LABEL,
    ) -> None:
        # ``client`` carries auth and TLS (:mod:`.http`); without one, plain HTTP(S) with
        # ``timeout``. A URL with user:password@ is refused (it would show in description).
        reject_credentials_in_url(url)
        # Every query groups and joins by it besides ``node`` (:func:`.promql.scoped`), and
        # a series' node is then its node key: ``cluster/node`` where it has one.
        scoped("", cluster_label)  # a label name, or ValueError
        self.cluster_label = cluster_label
        self._client = client if client is not None else PromApi(url, timeout=timeout)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.min_step = min_step
        self.max_points = max_points
        self.lookback = lookback
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promql")
        self.queries_total = 0
        #: What the answers brought, by the role a query has in a page (:meth:`as_role`; ""
        #: for a query sent outside one): ``[bytes, series, answers]``, their JSON's bytes
        #: and their series (a range query's series with all its points), what each part
        #: of a page costs to receive and read (bench/dashboard_bench.py reports them).
        self.answers_by_role: dict[str, list[int]] = {}
        self._role = threading.local()
        self._lock = threading.Lock()
        # The fleet pages' queries: at most MAX_IN_FLIGHT at once, whichever page sends
        # them, started in the order sent (a pool of that many threads takes its queue in
        # order; a semaphore in front of a larger pool let a thread that had just finished
        # one query take a later one before the threads already waiting, and the page's
        # small, first-needed queries waited behind its heaviest).
        self._page_pool = ThreadPoolExecutor(max_workers=self.MAX_IN_FLIGHT,
                                             thread_name_prefix="promql-page")

    @property
    def description(self) -> str:
        return f"Prometheus {self.url}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._page_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def answer_bytes_total(self) -> int:
        """The answers' JSON bytes so far, every role's."""
        with self._lock:
            return sum(b for b, _, _ in self.answers_by_role.values())

    @property
    def answer_series_total(self) -> int:
        """The answers' series so far, every role's."""
        with self._lock:
            return sum(n for _, n, _ in self.answers_by_role.values())

    # -- HTTP ------------------------------------------------------------------------------
    def as_role(self, role: str, query: Callable[[], Any]) -> Any:
        """``query()``, its answers counted under ``role`` in :attr:`answers_by_role` (the
        queries it sends from this thread)."""
        self._role.name = role
        try:
            return query()
        finally:
            self._role.name = ""

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        """The answer's ``data``; DataError (one line) otherwise: :meth:`PromApi.post_form`."""
        with self._lock:
            self.queries_total += 1
        decode = _DECODE_RANGE if path.endswith("query_range") else _DECODE_INSTANT

        def counted(raw: bytes) -> Any:
            out = decode(raw)
            data = out.get("data") if isinstance(out, dict) else None
            result = data.get("result") if isinstance(data, dict) else None
            series = len(result) if isinstance(result, list) else 0
            role = getattr(self._role, "name", "")
            with self._lock:
                counts = self.answers_by_role.setdefault(role, [0, 0, 0])
                counts[0] += len(raw)
                counts[1] += series
                counts[2] += 1
            return out

        return self._client.post_form(path, params, decode=counted)

    def instant(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        # ``nocache=1``: VictoriaMetrics moves an instant query at a time less than
        # ``-search.latencyOffset`` (30 s) before its now back to now - 30 s unless told not
        # to (Prometheus evaluates at ``time``, and ignores the parameter): the window's end
        # must be the same instant on both.
        data = self._api("/api/v1/query", {"query": scoped(promql, self.cluster_label),
                                           "time": f"{at:.3f}", "nocache": "1"})
        if data.get("resultType") != "vector":
            raise DataError(f"{self.description}: expected a vector, got {data.get('resultType')}")
        try:
            return [(labels, float(r["value"][1])) for r in data["result"]
                    if (labels := self._keyed(_labels(r["metric"]))) is not None]
        except _MALFORMED:
            raise DataError(f"{self.description}: malformed answer (not a Prometheus "
                            "vector)") from None

    def _keyed(self, labels: dict[str, str]) -> dict[str, str] | None:
        """A series' labels with its node as its node key (``cluster/node``, where it has a
        cluster) and without the cluster label; a series of no node (a workload's, a
        straggler group's) keeps its cluster as :data:`~.promql.GROUP_CLUSTER`. None for a
        device's or a node's series without the ``node`` label (a scrape config without the
        relabeling): the page cannot place it (its note says how many there are)."""
        if "node" not in labels and ("uuid" in labels or "instance_type" in labels):
            return None
        cluster = labels.pop(self.cluster_label, "")
        if cluster and "node" in labels:
            labels["node"] = node_key(cluster, labels["node"])
        elif cluster:
            labels[GROUP_CLUSTER] = cluster
        return labels

    def range(self, promql: str, window: Window) -> list[tuple[dict[str, str], Series]]:
        data = self._api("/api/v1/query_range", {
            "query": scoped(promql, self.cluster_label), "start": f"{window.start:.3f}",
            "end": f"{window.end:.3f}",
            "step": f"{window.step:.3f}",
        })
        out = []
        try:
            for r in data["result"]:
                # Columns first, each converted in one C-level pass (a fleet page can bring
                # back millions of points).
                times, values = zip(*r["values"], strict=True) if r["values"] else ((), ())
                if values and not isinstance(values[0], float):  # json.loads: strings
                    times, values = tuple(map(float, times)), tuple(map(float, values))
                labels = self._keyed(_labels(r["metric"]))
                if labels is not None:
                    out.append((labels, Series(times, values)))
        except _MALFORMED:
            raise DataError(f"{self.description}: malformed answer (not a Prometheus "
                            "matrix)") from None
        return out

    # -- queries ---------------------------------------------------------------------------
    def window(self, window_seconds: float) -> Window:
        """The window ending at the last multiple of its step (seconds since the epoch) at
        or before now. VictoriaMetrics rounds a range query's start and end down to
        multiples of the step (to cache its results); left to do it, its points fell up to
        a step before the window's end, a "for >= D" run measured to its last point came
        out a step short of the history measured to the end, and a node idle for all of a
        short history was not flagged there while Prometheus flagged it. On a grid of
        multiples of the step both stores answer at the same instants."""
        probe = make_window(window_seconds, self._clock(), min_step=self.min_step,
                            max_points=self.max_points)
        ms = round(probe.step * 1000)
        end = math.floor(round(probe.end * 1000) / ms) * ms / 1000
        return Window(start=end - probe.seconds, end=end, step=probe.step)

    def _r(self, window: Window) -> tuple[str, str]:
        """A step's windows: ``r`` for gauges (the step, at least ``lookback``), ``rr`` for
        counters' rates (the step, at least two ``lookback``: a rate needs two samples);
        each a millisecond short (:data:`EDGE`)."""
        r = max(window.step, self.lookback)
        return duration(r - EDGE), duration(max(window.step, 2 * self.lookback) - EDGE)

    #: The most queries one page has in flight at once: VictoriaMetrics answers at most
    #: ``-search.maxConcurrentRequests`` (twice its cores: 4 on 2) and refuses more after
    #: waiting 10 s (HTTP 503); more at once gains nothing on a store of a few cores.
    MAX_IN_FLIGHT = 4

    def rules_loaded(self, window: Window) -> bool:
        """Whether the page's recording rules serve ``window``: this store does not know
        them (:class:`gpuscope.dashboard.plan.PrometheusData` does), so never: a step query
        is always sent in its raw form."""
        return False

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """Each query's kept steps over the fleet page's window (:meth:`window`), the same
        answers as one query each (:meth:`_step_series_each`), in two range queries at most
        through the page's pool:

        1. every query without ``on``, and the queries of every ``on``, as one query
           (:func:`.steps.combined`: each text tagged with its position in
           :data:`.steps.STEP_LABEL`, joined with ``or``, split back by that label);
        2. each query with ``on``, asked of the devices its ``on`` flagged only (their nodes
           and UUIDs as matchers), its steps then kept where one of them was flagged, as
           ``and on (node, uuid)`` keeps them; for a query with ``slices``, also the series
           on those GPUs' MIG slices (:func:`.steps.slices_promql`, with ``parent_uuid``),
           kept where their GPU was flagged. A healthy fleet asks nothing here; a store
           computes ``and``'s left side whole before it filters (every holder of every GPU
           at every step: 7 s of Prometheus' time per such query at 5,000 nodes).

        Over :data:`MAX_QUERY_BYTES` a round is sent in parts (halves, as the node lists
        are), side by side. Each series' labels are ``node`` and the query's ``by`` (those
        the series has); its times are steps of the window; a query's series are in the
        order of their label sets. DataError if any part fails (the whole answer). Where
        the recording rules are loaded for the window (:meth:`rules_loaded`), a query with
        a :attr:`~.steps.StepQuery.recorded` form is sent in that form."""
        window = window or self.window(window_seconds)
        unique = list(dict.fromkeys(queries))
        recorded = (any(q.as_recorded is not q for q in unique)
                    and self.rules_loaded(window))

        def sent(q: StepQuery) -> StepQuery:
            return q.as_recorded if recorded else q

        first = list(dict.fromkeys([*(q for q in unique if not q.on),
                                    *(o for q in unique for o in q.on)]))
        rows = self._ranged({str(i): step_promql(sent(q), window.step, self.lookback)
                             for i, q in enumerate(first)}, window)
        got = {q: rows[str(i)] for i, q in enumerate(first)}
        # The second round: each query with ``on`` on the devices flagged, step by step.
        flagged: dict[StepQuery, set[tuple[str, str, float]]] = {}
        texts: dict[str, str] = {}
        for k, q in enumerate(q for q in unique if q.on):
            marks = {(lab["node"], lab.get("uuid", ""), t)
                     for other in q.on for lab, s in got[other] for t in s.times}
            flagged[q] = marks
            devices = sorted({f"{node}\0{uuid}" for node, uuid, _ in marks})
            if not devices:
                continue

            def build(part: Sequence[str], q: StepQuery = q) -> str:
                pairs = [d.split("\0") for d in part]
                among = {**node_matchers([n for n, _ in pairs], self.cluster_label),
                         "uuid": f'=~"{any_of(sorted({u for _, u in pairs}))}"'}
                return step_promql(sent(q).bare, window.step, self.lookback, among)

            for p, text in enumerate(_split(devices, build)):
                texts[f"{k}.{p}"] = text
            if not q.slices:
                continue

            def build_slices(part: Sequence[str], q: StepQuery = q) -> str:
                # The holders on the flagged GPUs' nodes, on the slices of those GPUs.
                pairs = [d.split("\0") for d in part]
                on = node_matchers([n for n, _ in pairs], self.cluster_label)
                parents = {**on, "parent_uuid": f'=~"{any_of(sorted({u for _, u in pairs}))}"'}
                return slices_promql(sent(q), window.step, self.lookback, on, parents)

            for p, text in enumerate(_split(devices, build_slices)):
                texts[f"{k}.s{p}"] = text
        later = self._ranged(texts, window) if texts else {}
        for k, q in enumerate(q for q in unique if q.on):
            kept = []
            for key, part in later.items():
                if key.split(".")[0] != str(k):
                    continue
                # A slice's series is kept where its GPU was flagged (``parent_uuid``).
                device_label = "parent_uuid" if key.split(".")[1].startswith("s") else "uuid"
                for lab, s in part:
                    device = (lab["node"], lab.get(device_label, ""))
                    on = [(t, v) for t, v in zip(s.times, s.values, strict=True)
                          if (*device, t) in flagged[q]]
                    if on:
                        kept.append((lab, Series(tuple(t for t, _ in on),
                                                 tuple(v for _, v in on))))
            got[q] = kept
        # Each query's series in the order its own answer has (Prometheus' ``labels.Compare``,
        # VictoriaMetrics' ``metricNameLess``: the sorted pairs).
        return {q: sorted(got[q], key=lambda row: sorted(row[0].items())) for q in unique}

    def _ranged(self, texts: Mapping[str, str], window: Window
                ) -> dict[str, list[tuple[dict[str, str], Series]]]:
        """Several queries' answers by their ids, asked as one range query
        (:func:`.steps.combined`; in parts over :data:`MAX_QUERY_BYTES`, side by side)."""
        ids = list(texts)
        order = {i: n for n, i in enumerate(ids)}
        futures = []
        for part in _split(ids, lambda part: combined({order[i]: texts[i] for i in part})):
            try:
                futures.append(self._page_pool.submit(self.range, part, window))
            except RuntimeError:  # closed: a page still computing when the dashboard stops
                raise DataError(f"{self.description}: closed") from None
        rows: dict[str, list[tuple[dict[str, str], Series]]] = {i: [] for i in ids}
        for fut in futures:
            for lab, series in fut.result():
                position = lab.pop(STEP_LABEL, "")
                mine = (rows.get(ids[int(position)])
                        if position.isdigit() and int(position) < len(ids) else None)
                if mine is None:  # not a label of ours: not an answer to these queries
                    raise DataError(f"{self.description}: a step query's series without its "
                                    f"{STEP_LABEL} label")
                mine.append((lab, series))
        return rows

    def _step_series_each(self, queries: Sequence[StepQuery], window_seconds: float
                          ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """:meth:`step_series` with one range query per query, as it was sent before the
        queries were combined (tests compare the two)."""
        window = self.window(window_seconds)
        futures: dict[StepQuery, Future[list[tuple[dict[str, str], Series]]]] = {}
        for q in queries:
            if q in futures:
                continue
            try:
                futures[q] = self._page_pool.submit(
                    self.range, step_promql(q, window.step, self.lookback), window)
            except RuntimeError:  # closed: a page still computing when the dashboard stops
                raise DataError(f"{self.description}: closed") from None
        return {q: fut.result() for q, fut in futures.items()}

    def node_queries(self, node: str, window: Window) -> dict[str, str]:
        node = validate_node(node)
        r, rr = self._r(window)
        match = node_equal(node, self.cluster_label)
        mem = selector("gpu_memory_used_bytes", match)
        cutil = selector("container_gpu_utilization_ratio", {**match, "namespace": '!=""'})
        info = selector("gpu_info", match)
        slices = selector("gpu_info", {**match, "parent_uuid": '!=""'})
        held = selector("container_gpu_allocated", {**match, "namespace": '!=""'})
        limit = selector("gpu_power_limit_watts", match)
        throttle = selector("gpu_throttle_seconds_total", match)
        return {
            # As the fleet page and the workload view read it: the busy counter's rate per
            # step (the exact mean), else the gauge's mean.
            "utilization": f"max by (gpu) ({_util_step(rr, match)})",
            "memory": f"max by (gpu) (avg_over_time({mem}[{r}]))",
            # Each container's utilization; and (``held="1"``) the steps at which a
            # container held a MIG slice, which has no per-container utilization
            # (:func:`~.reduce.slice_holder_lines` draws those by the slice's SM activity).
            "containers": (
                f"max by (namespace, pod, container, gpu) (avg_over_time({cutil}[{r}])"
                f" * on (node, uuid) group_left (gpu) max by (node, uuid, gpu) ({info}))"
                f" or label_replace(max by (namespace, pod, container, gpu) ("
                f"(max_over_time({held}[{r}]) > 0)"
                f" * on (node, uuid) group_left (gpu) max by (node, uuid, gpu) ({slices})),"
                f' "held", "1", "", "")'
            ),
            "activity": " or ".join(
                f'label_replace({_rate(f"gpu_{name}_active_seconds_total", rr, match, "gpu")},'
                f' "signal", "{name}", "", "")' for name in ("sm", "tensor", "dram")
            ),
            "power": (f"max by (gpu) ({_power_step(rr, match, 'node, gpu, uuid')}"
                      f" / on (node, uuid) group_left () max by (node, uuid) ({limit}))"),
            # (each exporter pod's, summed, as everywhere: a rollout)
            "throttle": (f"max by (gpu, reason) "
                         f"({summed_rate(throttle, rr, 'node, gpu, uuid, reason')})"),
        }

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        window = self.window(window_seconds)
        queries = self.node_queries(node, window)
        futures = {k: self._pool.submit(self.range, q, window) for k, q in queries.items()}
        res = {k: f.result() for k, f in futures.items()}
        activity: dict[str, dict[str, Series]] = {}
        for lab, s in res["activity"]:
            activity.setdefault(lab.get("signal", ""), {})[lab.get("gpu", "")] = s
        return NodeDetail(
            node=node, window=window,
            utilization={lab.get("gpu", ""): s for lab, s in res["utilization"]},
            memory_used={lab.get("gpu", ""): s for lab, s in res["memory"]},
            containers={
                **{f"{lab.get('namespace')}/{lab.get('pod')}/{lab.get('container')}"
                   f" (GPU {lab.get('gpu')})": s
                   for lab, s in res["containers"] if not lab.get("held")},
                **slice_holder_lines(
                    {(f"{lab.get('namespace')}/{lab.get('pod')}/{lab.get('container')}",
                      lab.get("gpu", "")): s
                     for lab, s in res["containers"] if lab.get("held")},
                    activity.get("sm", {})),
            },
            sm=activity.get("sm", {}), tensor=activity.get("tensor", {}),
            dram=activity.get("dram", {}),
            power_ratio={lab.get("gpu", ""): s for lab, s in res["power"]},
            throttle={f"{lab.get('gpu', '')} {lab.get('reason', '')}": s
                      for lab, s in res["throttle"]},
            queries=len(queries),
        )

    def workload_queries(self, namespace: str, workload: str, window: Window,
                         nodes: Sequence[str] = (), cluster: str | None = None
                         ) -> dict[str, str]:
        """The devices of one workload (``members``: an instant query over the window, in
        ``cluster`` where given; their index and model are read by :func:`index_queries`,
        on their nodes), and the utilization, SM activity and power per step of the devices
        on ``nodes`` (``workload``, ``workload#1``...: the node list split to keep each query
        short; the caller keeps the workload's devices)."""
        namespace, workload = validate_namespace(namespace), validate_workload(workload)
        _, rr = self._r(window)
        w = duration(window.seconds)
        # One cluster's run (the page scoped to it): a job of one name in two clusters is
        # two runs.
        mine = {} if cluster is None else {self.cluster_label: cluster}
        cutil = selector("container_gpu_utilization_ratio", None, namespace=namespace, **mine)
        held = selector("container_gpu_allocated", None, namespace=namespace, **mine)
        pods = selector("gpu_pod_info", None, namespace=namespace, workload=workload, **mine)
        out = {
            # The devices its containers used or held: a MIG slice has no per-container
            # utilization (NVML gives none per process there), its holder is on it all the
            # same.
            "members": (
                f"max by (node, uuid, pod) ((max by (node, namespace, pod, uuid)"
                f" (last_over_time({cutil}[{w}]))"
                f" or max by (node, namespace, pod, uuid) (max_over_time({held}[{w}]) > 0))"
                f" * on (node, namespace, pod) group_left ()"
                f" max by (node, namespace, pod) (last_over_time({pods}[{w}])))"),
        }

        def signals(names: Sequence[str]) -> str:
            match = node_matchers(names, self.cluster_label)
            return " or ".join([
                f'label_replace({_util_step(rr, match)}, "signal", "utilization", "", "")',
                f'label_replace({_rate("gpu_sm_active_seconds_total", rr, match)},'
                f' "signal", "sm", "", "")',
                f'label_replace({_power_step(rr, match)}, "signal", "power", "", "")',
            ])

        for i, q in enumerate(_split(sorted(set(nodes)), signals)):
            out["workload" if i == 0 else f"workload#{i}"] = q
        return out

    def workload_detail(self, namespace: str, workload: str, window_seconds: float,
                        first: Collection[GpuRef] = (), cluster: str | None = None
                        ) -> WorkloadDetail:
        window = self.window(window_seconds)
        members = self.instant(
            self.workload_queries(namespace, workload, window, cluster=cluster)["members"],
            window.end)
        pods: dict[GpuRef, set[str]] = {}
        for lab, _ in members:
            pods.setdefault(_gref(lab), set()).add(lab.get("pod", ""))
        asked = index_queries({ref.node for ref in pods}, self.cluster_label, window.seconds)
        index = self._index(asked, window.end)
        # A device without gpu_info in the window is left out, as a join with gpu_info
        # would; one of a node gone before the window's end (or a slice remade) is kept,
        # as the embedded store keeps it.
        pods = {ref: names for ref, names in pods.items() if ref in index}
        devices = pick_devices(
            [WorkloadDevice(ref, index[ref][0], index[ref][1], tuple(sorted(pods[ref])))
             for ref in pods], first)
        queries = self.workload_queries(namespace, workload, window,
                                        [d.ref.node for d in devices])
        by_signal: dict[str, dict[GpuRef, Series]] = {}
        shown = {d.ref for d in devices}
        futures = [self._pool.submit(self.range, q, window)
                   for k, q in queries.items() if k != "members"]
        for fut in futures:
            for lab, s in fut.result():
                if _gref(lab) in shown:
                    by_signal.setdefault(lab.get("signal", ""), {})[_gref(lab)] = s
        return WorkloadDetail(
            namespace=namespace, workload=workload, window=window, devices=devices,
            utilization=by_signal.get("utilization", {}), sm=by_signal.get("sm", {}),
            power=by_signal.get("power", {}),
            queries=len(queries) + len(asked),
            total_devices=len(pods),
        )

    def _index(self, asked: Sequence[str], at: float) -> dict[GpuRef, tuple[str, str]]:
        """Each device's index and model at ``at`` (over the range ``asked`` gives), from
        ``asked`` (:func:`index_queries`)."""
        futures = [self._pool.submit(self.instant, q, at) for q in asked]
        return {_gref(lab): (lab.get("gpu", ""), lab.get("model", ""))
                for fut in futures for lab, _ in fut.result()}

    def pod_queries(self, namespace: str, pod: str, window: Window,
                    cluster: str | None = None) -> dict[str, str]:
        """One pod's utilization and memory per container and device, per step, in
        ``cluster`` where given (the devices' index is read afterwards by
        :func:`index_queries`, on the pod's node)."""
        namespace, pod = validate_namespace(namespace), validate_pod(pod)
        r, _ = self._r(window)
        mine = {} if cluster is None else {self.cluster_label: cluster}
        util = selector("container_gpu_utilization_ratio", None, namespace=namespace, pod=pod,
                        **mine)
        mem = selector("container_gpu_memory_used_bytes", None, namespace=namespace, pod=pod,
                       **mine)
        by = "node, container, uuid"
        return {
            "utilization": f"max by ({by}) (avg_over_time({util}[{r}]))",
            "memory": f"max by ({by}) (avg_over_time({mem}[{r}]))",
        }

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        window = self.window(window_seconds)
        queries = self.pod_queries(namespace, pod, window, cluster)
        futures = {k: self._pool.submit(self.range, q, window) for k, q in queries.items()}
        res = {k: f.result() for k, f in futures.items()}
        asked = index_queries({lab.get("node", "") for rows in res.values() for lab, _ in rows},
                              self.cluster_label, window.seconds)
        index = self._index(asked, window.end)

        def by_key(rows: list[tuple[dict[str, str], Series]]) -> dict[str, Series]:
            # A device without gpu_info in the window is left out, as a join would (one of
            # a node gone before its end is kept: what the pod held there).
            return {f"{lab.get('container')} ({lab.get('node')} GPU {index[ref][0]})": s
                    for lab, s in rows if (ref := _gref(lab)) in index}

        return PodDetail(
            namespace=namespace, pod=pod, window=window,
            utilization=by_key(res["utilization"]), memory_used=by_key(res["memory"]),
            queries=len(queries) + len(asked),
        )


