"""``--prometheus URL``: any Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, ...).

Every aggregation happens server-side (``max by``, ``avg_over_time`` ... per step, one point
per step and series), so a fleet of thousands of GPUs costs a fixed handful of queries of
bounded size. User input reaches PromQL only validated *and* escaped (:mod:`.promql`)."""


from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuscope.dashboard.analysis import Thresholds
from gpuscope.dashboard.analysis.allocated import held_usage
from gpuscope.dashboard.analysis.spinning import spinning_steps
from gpuscope.dashboard.analysis.stragglers import slow_candidates, stragglers, workload_groups
from gpuscope.dashboard.data.http import PromApi, reject_credentials_in_url
from gpuscope.dashboard.data.promql import any_of, duration, escape_label_value, selector
from gpuscope.dashboard.data.source import (
    DataError,
    make_window,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.series import (
    ContainerRef,
    Evidence,
    FleetData,
    GpuInfo,
    GpuRef,
    NodeDetail,
    NodeInfo,
    PodDetail,
    PodInfo,
    PodKey,
    Series,
    UtilStats,
    Window,
    WorkloadDetail,
    WorkloadDevice,
    WorkSignals,
    pick_devices,
)

# -- Prometheus ------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


def _labels(metric: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in metric.items() if k != "__name__"}


def _rate(metric: str, r: str, match: Mapping[str, str] | None = None,
          by: str = "node, gpu, uuid") -> str:
    """Per step, the mean rate of a counter (the mean of the activity it integrates), from
    the steps at which the series is at least ``r`` old: before, Prometheus divides what
    little increase there is by all of ``r`` and the rate reads low (a busy GPU would look
    idle, a working one spinning), so those steps are left out."""
    sel = selector(metric, match)
    return (f"(max by ({by}) (rate({sel}[{r}]))"
            f" and on ({by}) max by ({by}) ({sel} offset {r}))")


def _util_step(r: str, match: Mapping[str, str] | None = None, by: str = "node, gpu, uuid"
               ) -> str:
    """Per step, mean utilization: ``rate(gpu_busy_seconds_total)``, else the gauge's mean
    (an exporter without the busy counter)."""
    util = selector("gpu_utilization_ratio", match)
    return (f"({_rate('gpu_busy_seconds_total', r, match, by)}"
            f" or max by ({by}) (avg_over_time({util}[{r}])))")


def _power_step(r: str, match: Mapping[str, str] | None = None, by: str = "node, gpu, uuid"
                ) -> str:
    """Per step, mean power in watts: ``rate(gpu_energy_joules_total)``, else the gauge's."""
    power = selector("gpu_power_watts", match)
    return (f"({_rate('gpu_energy_joules_total', r, match, by)}"
            f" or max by ({by}) (avg_over_time({power}[{r}])))")


def _gref(lab: Mapping[str, str]) -> GpuRef:
    return GpuRef(lab.get("node", ""), lab.get("uuid", ""))


def _cref(lab: Mapping[str, str]) -> ContainerRef:
    return ContainerRef(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""),
                        lab.get("container", ""), lab.get("uuid", ""))


def _merge_signals(
    parts: Iterable[tuple[ContainerRef, str, Series]],
) -> tuple[dict[ContainerRef, Series], dict[ContainerRef, str]]:
    """One series per container from its per-signal parts (a container's signal may change
    within the window); its signal is that of its latest point."""
    points: dict[ContainerRef, dict[float, tuple[float, str]]] = {}
    for ref, signal, series in parts:
        mine = points.setdefault(ref, {})
        for t, v in zip(series.times, series.values, strict=True):
            mine[t] = (v, signal)
    usage, signals = {}, {}
    for ref, mine in points.items():
        times = sorted(mine)
        usage[ref] = Series(tuple(times), tuple(mine[t][0] for t in times))
        signals[ref] = mine[times[-1]][1]
    return usage, signals


def _evidence(rows: Iterable[tuple[dict[str, str], float]]) -> dict[GpuRef, Evidence]:
    parts: dict[GpuRef, dict[str, Any]] = {}
    for lab, v in rows:
        mine = parts.setdefault(_gref(lab), {"throttle": {}})
        stat = lab.get("stat")
        if stat == "throttle":
            mine["throttle"][lab.get("reason", "")] = v
        elif stat in ("sm_clock", "temperature"):
            mine[stat] = v
    return {ref: Evidence(p["throttle"], p.get("sm_clock"), p.get("temperature"))
            for ref, p in parts.items()}


@dataclass(frozen=True, slots=True)
class FollowUp:
    """What the first round singled out for the second (UUIDs, nodes)."""

    idle: Sequence[str] = ()
    idle_slices: Sequence[str] = ()  # those of ``idle`` that are MIG slices
    idle_nodes: Sequence[str] = ()
    shared: Sequence[str] = ()
    input_candidates: Sequence[str] = ()
    spinning: Sequence[str] = ()
    throttled: Sequence[str] = ()
    held: Sequence[str] = ()
    workload_devices: Sequence[str] = ()
    evidence: Sequence[str] = ()
    evidence_seconds: float = 0.0


#: Above this many devices the evidence query asks about every device instead of naming them.
MAX_EVIDENCE = 1000
#: A workload's median evidence (throttling, clock, temperature) is taken over at most this
#: many of its GPUs besides its stragglers, evenly spread over them: plenty for a median,
#: and a 2,000-GPU job costs no more to look at than a 64-GPU one.
EVIDENCE_PEERS = 64


class PrometheusData:
    """Range and instant queries against a Prometheus-compatible API.

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
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.time,
        workers: int = 8,
        client: PromApi | None = None,
    ) -> None:
        # ``client`` carries auth and TLS (:mod:`.http`); without one, plain HTTP(S) with
        # ``timeout``. A URL with user:password@ is refused (it would show in description).
        reject_credentials_in_url(url)
        self._client = client if client is not None else PromApi(url, timeout=timeout)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.min_step = min_step
        self.max_points = max_points
        self.lookback = lookback
        self.thresholds = thresholds or Thresholds()
        self.idle_threshold = self.thresholds.idle_utilization
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promql")
        self.queries_total = 0
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        return f"Prometheus {self.url}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- HTTP ------------------------------------------------------------------------------
    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        """The answer's ``data``; DataError (one line) otherwise: :meth:`PromApi.post_form`."""
        with self._lock:
            self.queries_total += 1
        return self._client.post_form(path, params)

    def instant(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        data = self._api("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        if data.get("resultType") != "vector":
            raise DataError(f"{self.description}: expected a vector, got {data.get('resultType')}")
        return [(_labels(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def range(self, promql: str, window: Window) -> list[tuple[dict[str, str], Series]]:
        data = self._api("/api/v1/query_range", {
            "query": promql, "start": f"{window.start:.3f}", "end": f"{window.end:.3f}",
            "step": f"{window.step:.3f}",
        })
        out = []
        for r in data["result"]:
            points = r["values"]
            out.append((_labels(r["metric"]), Series(
                tuple(float(p[0]) for p in points), tuple(float(p[1]) for p in points)
            )))
        return out

    # -- queries ---------------------------------------------------------------------------
    def window(self, window_seconds: float) -> Window:
        return make_window(
            window_seconds, self._clock(), min_step=self.min_step, max_points=self.max_points
        )

    def _r(self, window: Window) -> str:
        return duration(max(window.step, self.lookback))

    # -- the expressions of the verdicts, per step, for the devices round 1 singled out -------
    def _idle_parts(self, r: str, match: Mapping[str, str] | None = None,
                    slice_match: Mapping[str, str] | None = None,
                    slices_too: bool = True) -> list[str]:
        """Each device's idle activity below the threshold, labelled with its ``signal``:
        utilization (whole GPUs, slices that report it without GPM), SM activity (MIG slices
        with GPM), or (a MIG slice without either) 0 while no process holds memory on it.
        ``slice_match`` narrows the slices' parts further (they concern slices only);
        without ``slices_too`` they are left out."""
        th = self.thresholds
        idle = f"{th.idle_utilization!r}"
        gby = "node, gpu, uuid"
        util = selector("gpu_utilization_ratio", match)
        gpm = selector("gpu_sm_active_seconds_total", match)
        slices = selector("gpu_info", {**(match or {}), "parent_uuid": '!=""'})
        parts = [
            f'label_replace(max by ({gby}) (max_over_time({util}[{r}])) < {idle}'
            f' unless on (node, uuid) ({gpm} and on (node, uuid) {slices}),'
            f' "signal", "utilization", "", "")',
        ]
        if not slices_too:
            return parts
        m = slice_match if slice_match is not None else match
        util = selector("gpu_utilization_ratio", m)
        gpm = selector("gpu_sm_active_seconds_total", m)
        slices = selector("gpu_info", {**(m or {}), "parent_uuid": '!=""'})
        memory = selector("gpu_memory_used_bytes", m)
        cmem = selector("container_gpu_memory_used_bytes", m)
        return [
            *parts,
            f'label_replace({_rate("gpu_sm_active_seconds_total", r, m)} < {idle}'
            f' and on (node, uuid) {slices}, "signal", "sm", "", "")',
            f'label_replace(max by ({gby}) (max_over_time({memory}[{r}])) * 0'
            f' and on (node, uuid) {slices} unless on (node, uuid) {util}'
            f' unless on (node, uuid) {gpm}'
            f' unless on (node, uuid) (max by (node, uuid) (max_over_time({cmem}[{r}])) > 0),'
            f' "signal", "process", "", "")',
        ]

    def _throttle(self, r: str, match: Mapping[str, str] | None = None) -> str:
        th = self.thresholds
        reasons = selector("gpu_throttle_seconds_total",
                           {**(match or {}), "reason": f'=~"{any_of(th.throttle_reasons)}"'})
        return (f"max by (node, gpu, uuid, reason) (rate({reasons}[{r}]))"
                f" >= {th.throttle_ratio!r}")

    def _held_parts(self, r: str, match: Mapping[str, str] | None = None) -> list[str]:
        """Per container, what it uses of what it holds where that is below the idle
        threshold: the device's SM activity where it has GPM and one holder, else the
        container's utilization times the device's holders (its share of a time-sliced GPU),
        else (a MIG slice without GPM) 0 while it has no process there."""
        th = self.thresholds
        idle = f"{th.idle_utilization!r}"
        cby = "node, namespace, pod, container, uuid"
        ns = {**(match or {}), "namespace": '!=""'}
        alloc = selector("container_gpu_allocated", ns)
        held = f"max by ({cby}) (max_over_time({alloc}[{r}]))"
        sole_gpm = (f"(({_rate('gpu_sm_active_seconds_total', r, match)}) and on (node, uuid)"
                    f" (count by (node, uuid) ({held}) == 1))")
        cutil_max = (f"max by ({cby}) (max_over_time("
                     f"{selector('container_gpu_utilization_ratio', ns)}[{r}]))")
        cmem = selector("container_gpu_memory_used_bytes", ns)
        slices = selector("gpu_info", {**(match or {}), "parent_uuid": '!=""'})
        gpm = selector("gpu_sm_active_seconds_total", match)
        return [
            f'label_replace({held} * on (node, uuid) group_left () ({sole_gpm} < {idle}),'
            f' "signal", "sm", "", "")',
            f'label_replace(({cutil_max} * on (node, uuid) group_left ()'
            f' count by (node, uuid) ({held}) < {idle}) and on ({cby}) {held}'
            f' unless on (node, uuid) {sole_gpm}, "signal", "utilization", "", "")',
            f'label_replace((max by ({cby}) (max_over_time({cmem}[{r}])) == 0)'
            f' and on ({cby}) {held} and on (node, uuid) {slices}'
            f' unless on (node, uuid) {gpm} unless on ({cby}) {cutil_max},'
            f' "signal", "process", "", "")',
        ]

    def fleet_queries(self, window: Window, namespace: str | None) -> dict[str, str]:
        """The fleet page's first round of PromQL, by role; :attr:`RANGE_QUERIES` are range
        queries over the window, the others instant queries at its end. Every verdict needs
        its condition at the latest step (a trailing run), so the first round reads each
        device's and container's signals at the latest step (``now``): the same rules,
        applied to that one step, single out what a second round (:meth:`second_round`)
        asks the history of, and only that."""
        r = self._r(window)
        w = duration(window.seconds)
        s = duration(window.step)
        util = "gpu_utilization_ratio"
        cutil = selector("container_gpu_utilization_ratio", {"namespace": '!=""'})
        pods = "gpu_pod_info"
        ns_filter = ""
        if namespace is not None:
            mine = selector("container_gpu_utilization_ratio", namespace=namespace)
            ns_filter = f" and on (node, uuid) max by (node, uuid) (max_over_time({mine}[{r}]))"
            pods = selector("gpu_pod_info", namespace=namespace)
        cby = "node, namespace, pod, container, uuid"
        gby = "node, gpu, uuid"
        gpm = "gpu_sm_active_seconds_total"
        alloc = selector("container_gpu_allocated", {"namespace": '!=""'})
        slices = 'gpu_info{parent_uuid!=""}'
        th = self.thresholds
        busy = min(th.spin_busy, th.slow_busy)
        sm = _rate("gpu_sm_active_seconds_total", r)

        def stat(expr: str, name: str) -> str:
            return f'label_replace({expr}, "stat", "{name}", "", "")'

        return {
            "gpus": "max by (node, gpu, uuid, model, parent_uuid, mig_profile) (gpu_info)",
            "nodes": "max by (node, instance_type, zone, capacity_type) (gpu_node_info)",
            "gpu_stats": " or ".join([
                # The window mean of each step's rate of the busy counter (else, without
                # one, the gauge's mean): steps before a device appeared do not count.
                stat(f"max by ({gby}) (avg_over_time("
                     f"rate(gpu_busy_seconds_total[{r}])[{w}:{s}]))"
                     f" or max by ({gby}) (avg_over_time({util}[{w}]))", "mean"),
                # When data begins: the first step at which any device reported.
                stat(f"min_over_time(timestamp(count({util}))[{w}:{s}])", "first"),
            ]),
            "containers": f"max by ({cby}) (avg_over_time({cutil}[{r}])){ns_filter}",
            "pods": f"max by (node, namespace, pod, workload) (last_over_time({pods}[{w}]))",
            # The latest step: each device's signals, each container's use of what it holds,
            # the throttled GPUs. Only what a rule can use: utilization from 0.5 up (the
            # least a spinning or slow GPU shows), tensor and DRAM activity where SM activity
            # is low enough to spin, power where there is no GPM, process memory on slices.
            "now": " or ".join([
                stat(f"max by ({gby}) (max_over_time({util}[{r}]))", "util_max"),
                stat(f"{_util_step(r)} >= {busy!r}", "util"),
                stat(sm, "sm"),
                *(stat(f"{_rate(f'gpu_{name}_active_seconds_total', r)}"
                       f" and on (node, uuid) ({sm} < {th.spin_sm!r})", name)
                  for name in ("tensor", "dram")),
                stat(f"{_power_step(r)} unless on (node, uuid) {gpm}", "power"),
                stat(f"max by ({gby}) (max_over_time(gpu_power_limit_watts[{r}]))"
                     f" unless on (node, uuid) {gpm}", "limit"),
                stat(f"max by ({gby}) (max_over_time(gpu_memory_used_bytes[{r}]))"
                     f" and on (node, uuid) {slices}", "slice_memory"),
                stat(f"max by ({cby}) (max_over_time({alloc}[{r}]))", "held"),
                stat(f"max by ({cby}) (max_over_time({cutil}[{r}]))", "cutil"),
                stat(f"max by ({cby}) (max_over_time(container_gpu_memory_used_bytes[{r}]))"
                     f" and on (node, uuid) {slices}", "cmem"),
                stat(self._throttle(r), "throttle"),
            ]),
        }

    RANGE_QUERIES = frozenset({"containers", "idle_steps", "allocated", "shared", "spinning",
                               "throttled", "held_idle", "workload_signals"})
    INSTANT_QUERIES = frozenset({"gpus", "nodes", "gpu_stats", "pods", "now", "evidence",
                                 "stats"})

    def second_round(self, window: Window, ask: FollowUp, namespace: str | None = None
                     ) -> dict[str, str]:
        """Only for what the first round singled out: per step, the idle steps of the devices
        idle now, allocation on the nodes idle now (the waste split), the utilization of
        devices shared by several containers (time-slicing starvation), the work signals of
        the GPUs that spin now, the throttled steps of the GPUs throttled now, the idle steps
        of the containers idle now and the signals of the slow-rank candidates' devices;
        and, at the end, raw-sample statistics of containers near the input-starved range
        and the stragglers' evidence over ``ask.evidence_seconds``."""
        r = self._r(window)
        w = duration(window.seconds)
        out = {}

        def uuids(values: Iterable[str]) -> dict[str, str] | None:
            found = sorted(set(values))
            return {"uuid": f'=~"{any_of(found)}"'} if found else None

        if (match := uuids(ask.idle)) is not None:
            slice_match = uuids(ask.idle_slices)
            out["idle_steps"] = " or ".join(self._idle_parts(
                r, match, slice_match, slices_too=slice_match is not None))
        nodes = sorted(set(ask.idle_nodes))
        if nodes:
            alloc = selector("container_gpu_allocated", {"node": f'=~"{any_of(nodes)}"'})
            out["allocated"] = f"max by (node, uuid) (max_over_time({alloc}[{r}]))"
        if (match := uuids(ask.shared)) is not None:
            util = selector("gpu_utilization_ratio", match)
            out["shared"] = f"max by (node, gpu, uuid) (avg_over_time({util}[{r}]))"
        if (match := uuids(ask.input_candidates)) is not None:
            if namespace is None:
                match["namespace"] = '!=""'
                util = selector("container_gpu_utilization_ratio", match)
                mem = selector("container_gpu_memory_used_bytes", match)
            else:
                util = selector("container_gpu_utilization_ratio", match, namespace=namespace)
                mem = selector("container_gpu_memory_used_bytes", match, namespace=namespace)
            cby = "node, namespace, pod, container, uuid"
            out["stats"] = " or ".join([
                f'label_replace(avg by ({cby}) (avg_over_time({util}[{w}])),'
                f' "stat", "mean", "", "")',
                f'label_replace(avg by ({cby}) (stddev_over_time({util}[{w}])),'
                f' "stat", "stddev", "", "")',
                f'label_replace(max by ({cby}) (count_over_time({util}[{w}])),'
                f' "stat", "count", "", "")',
                f'label_replace(max by ({cby}) (max_over_time({mem}[{w}])),'
                f' "stat", "memory", "", "")',
            ])
        if (match := uuids(ask.spinning)) is not None:
            out["spinning"] = " or ".join([
                f'label_replace({_util_step(r, match)}, "signal", "utilization", "", "")',
                *(f'label_replace({_rate(f"gpu_{name}_active_seconds_total", r, match)},'
                  f' "signal", "{name}", "", "")' for name in ("sm", "tensor", "dram")),
                f'label_replace({_power_step(r, match)}, "signal", "power", "", "")',
            ])
        if (match := uuids(ask.throttled)) is not None:
            out["throttled"] = self._throttle(r, match)
        if (match := uuids(ask.held)) is not None:
            out["held_idle"] = " or ".join(self._held_parts(r, match))
        if (match := uuids(ask.workload_devices)) is not None:
            out["workload_signals"] = " or ".join([
                f'label_replace({_util_step(r, match)}, "signal", "utilization", "", "")',
                f'label_replace({_rate("gpu_sm_active_seconds_total", r, match)},'
                f' "signal", "sm", "", "")',
                f'label_replace({_power_step(r, match)}, "signal", "power", "", "")',
            ])
        if ask.evidence_seconds > 0:
            d = duration(ask.evidence_seconds)
            match = uuids(ask.evidence) if len(set(ask.evidence)) <= MAX_EVIDENCE else None
            gby = "node, gpu, uuid"
            throttle = selector("gpu_throttle_seconds_total", match)
            out["evidence"] = " or ".join([
                f'label_replace(max by ({gby}, reason) (rate({throttle}[{d}])) > 0,'
                f' "stat", "throttle", "", "")',
                f'label_replace(max by ({gby}) (avg_over_time('
                f'{selector("gpu_sm_clock_hertz", match)}[{d}])), "stat", "sm_clock", "", "")',
                f'label_replace(max by ({gby}) (avg_over_time('
                f'{selector("gpu_temperature_celsius", match)}[{d}])),'
                f' "stat", "temperature", "", "")',
            ])
        return out

    def _run(self, queries: Mapping[str, str], window: Window) -> dict[str, Any]:
        futures: dict[str, Future[Any]] = {}
        for name, promql in queries.items():
            if name in self.RANGE_QUERIES:
                futures[name] = self._pool.submit(self.range, promql, window)
            else:
                futures[name] = self._pool.submit(self.instant, promql, window.end)
        return {name: fut.result() for name, fut in futures.items()}  # DataError propagates

    def fleet(self, window_seconds: float, namespace: str | None = None) -> FleetData:
        if namespace is not None:
            namespace = validate_namespace(namespace)
        window = self.window(window_seconds)
        queries = self.fleet_queries(window, namespace)
        results = self._run(queries, window)
        th = self.thresholds
        end = window.end

        gpus = {}
        for lab, _ in results["gpus"]:
            info = GpuInfo(
                node=lab.get("node", ""), gpu=lab.get("gpu", ""), uuid=lab.get("uuid", ""),
                model=lab.get("model", ""), parent_uuid=lab.get("parent_uuid", ""),
                mig_profile=lab.get("mig_profile", ""),
            )
            gpus[info.ref] = info
        nodes = {
            lab.get("node", ""): NodeInfo(
                lab.get("node", ""), lab.get("instance_type", ""), lab.get("zone", ""),
                lab.get("capacity_type", ""),
            )
            for lab, _ in results["nodes"]
        }
        slices = {ref for ref, info in gpus.items() if not info.is_physical}

        gpu_mean: dict[GpuRef, float] = {}
        first: float | None = None
        for lab, v in results["gpu_stats"]:
            stat = lab.get("stat")
            if stat == "mean":
                gpu_mean[_gref(lab)] = v
            elif stat == "first" and math.isfinite(v):
                first = v
        containers = {_cref(lab): s for lab, s in results["containers"] if lab.get("namespace")}
        pods = {}
        for lab, _ in results["pods"]:
            key = PodKey(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""))
            pods[key] = PodInfo(key.node, key.namespace, key.pod, lab.get("workload", ""))

        # The latest step, as one-point series for the rules.
        devices: dict[str, dict[GpuRef, Series]] = {}
        users: dict[str, dict[ContainerRef, Series]] = {}
        throttled_now: list[str] = []
        for lab, v in results["now"]:
            stat = lab.get("stat", "")
            point = Series((end,), (v,))
            if stat == "throttle":
                throttled_now.append(lab.get("uuid", ""))
            elif stat in ("held", "cutil", "cmem"):
                users.setdefault(stat, {})[_cref(lab)] = point
            else:
                devices.setdefault(stat, {})[_gref(lab)] = point
        gpu_now = {ref: s.values[0] for ref, s in devices.get("util_max", {}).items()}
        # GPM: the devices with SM activity now (idle ones too: a rate of 0 is a value).
        gpm = set(devices.get("sm", {}))
        limits = {ref: s.values[0] for ref, s in devices.get("limit", {}).items()}
        signals_now = WorkSignals(
            utilization=devices.get("util", {}), sm=devices.get("sm", {}),
            tensor=devices.get("tensor", {}), dram=devices.get("dram", {}),
            power=devices.get("power", {}), power_limit=limits, gpm=frozenset(gpm))
        spin_now = set(spinning_steps(signals_now, th.spin_rule))
        # Idle now, by each device's own signal (see analysis.idle).
        process_now: set[GpuRef] = {ref.gpu for ref, s in users.get("cmem", {}).items()
                                    if s.values[0] > 0}
        idle_now: set[GpuRef] = set()
        for ref, v in gpu_now.items():
            if not (ref in slices and ref in gpm) and v < th.idle_utilization:
                idle_now.add(ref)
        for ref in slices & gpm:
            sm_now = devices.get("sm", {}).get(ref)
            if sm_now is not None and sm_now.values[0] < th.idle_utilization:
                idle_now.add(ref)
        for ref in devices.get("slice_memory", {}):
            if ref not in gpu_now and ref not in gpm and ref not in process_now:
                idle_now.add(ref)
        held_now, _ = held_usage(users.get("held", {}), users.get("cutil", {}),
                                 users.get("cmem", {}), signals_now.sm, gpm, slices)
        held_idle_now = {ref.uuid for ref, s in held_now.items()
                         if s.values and s.values[-1] < th.allocated_idle_utilization}
        groups = workload_groups(containers, pods, gpus)
        candidates = slow_candidates(groups, signals_now, end, factor=th.slow_factor,
                                     busy=th.slow_busy)

        # Second round: only what the first singled out.
        slices_of: dict[GpuRef, list[GpuRef]] = {}
        for info in gpus.values():
            if not info.is_physical:
                slices_of.setdefault(GpuRef(info.node, info.parent_uuid), []).append(info.ref)
        node_idle: dict[str, bool] = {}
        for info in gpus.values():
            if info.is_physical:
                parts = slices_of.get(info.ref) or [info.ref]
                node_idle[info.node] = node_idle.get(info.node, True) and all(
                    p in idle_now or p in spin_now for p in parts)
        sharers: dict[GpuRef, int] = {}
        for user in containers:
            sharers[user.gpu] = sharers.get(user.gpu, 0) + 1
        # Input starvation needs raw-sample statistics; ask only where the per-step means
        # put a container's mean in the suspicious range (with a margin for the
        # difference between the mean of step means and the mean of raw samples).
        input_candidates = [
            ref.uuid for ref, series in containers.items()
            if series.values and (namespace is None or ref.namespace == namespace)
            and th.input_low * 0.5 < sum(series.values) / len(series.values)
            < min(1.0, th.input_high * 1.5)
        ]
        # A straggler's evidence: in the workloads with a stalled straggler or a slow
        # candidate, theirs and (for the workload's medians) that of up to
        # EVIDENCE_PEERS other GPUs of it, over the straggler duration (or the history
        # there is).
        stalled = stragglers(containers, pods, window, self._history_start(window, first),
                             gpus=gpus, factor=th.straggler_factor,
                             duration=th.straggler_duration, groups=groups)
        judged: dict[tuple[str, str, str], set[GpuRef]] = {k: set(v)
                                                          for k, v in candidates.items()}
        for one in stalled.stragglers:
            judged.setdefault((one.namespace, one.workload, one.model), set()).add(one.gpu)
        evidence_devices: list[str] = []
        for group in groups:
            if group.key in judged:
                peers = sorted(g for g in group.devices if g not in judged[group.key])
                every = max(1, -(-len(peers) // EVIDENCE_PEERS))
                evidence_devices += [g.uuid for g in judged[group.key]]
                evidence_devices += [g.uuid for g in peers[::every]]
        history = window.end - self._history_start(window, first)
        ask = FollowUp(
            idle=[g.uuid for g in idle_now],
            idle_slices=[g.uuid for g in idle_now if g in slices],
            idle_nodes=[n for n, idle in node_idle.items() if idle],
            shared=[g.uuid for g, n in sharers.items() if n >= 2],
            input_candidates=input_candidates,
            spinning=[g.uuid for g in spin_now],
            throttled=throttled_now,
            held=sorted(held_idle_now),
            workload_devices=[g.uuid for group in groups
                              if group.key in candidates for g in group.devices],
            evidence=evidence_devices,
            evidence_seconds=(min(th.straggler_duration, window.seconds, max(history, 0.0))
                              if judged else 0.0),
        )
        more = self.second_round(window, ask, namespace)
        later = self._run(more, window) if more else {}

        stats_parts: dict[ContainerRef, dict[str, float]] = {}
        for lab, v in later.get("stats", []):
            stats_parts.setdefault(_cref(lab), {})[lab.get("stat", "")] = v
        stats = {
            ref: UtilStats(
                mean=p.get("mean", 0.0), stddev=p.get("stddev", 0.0),
                samples=int(p.get("count", 0)), memory_bytes=p.get("memory", 0.0),
            )
            for ref, p in stats_parts.items() if "mean" in p
        }
        busy_max: dict[GpuRef, Series] = {}
        idle_signal: dict[GpuRef, str] = {}
        for lab, s in later.get("idle_steps", []):
            ref = _gref(lab)
            busy_max[ref] = s
            idle_signal[ref] = lab.get("signal", "utilization")
        throttle: dict[GpuRef, dict[str, Series]] = {}
        for lab, s in later.get("throttled", []):
            throttle.setdefault(_gref(lab), {})[lab.get("reason", "")] = s
        usage, usage_signal = _merge_signals(
            (_cref(lab), lab.get("signal", "utilization"), s)
            for lab, s in later.get("held_idle", []) if lab.get("namespace"))
        by_signal: dict[str, dict[GpuRef, Series]] = {}
        for lab, s in [*later.get("spinning", []), *later.get("workload_signals", [])]:
            by_signal.setdefault(lab.get("signal", ""), {})[_gref(lab)] = s
        signals = WorkSignals(
            utilization=by_signal.get("utilization", {}), sm=by_signal.get("sm", {}),
            tensor=by_signal.get("tensor", {}), dram=by_signal.get("dram", {}),
            power=by_signal.get("power", {}), power_limit=limits, gpm=frozenset(gpm),
            throttle=throttle,
        )
        return FleetData(
            window=window,
            history_start=self._history_start(window, first),
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max=busy_max,
            gpu_now=gpu_now,
            gpu_mean=gpu_mean,
            gpu_step_mean={_gref(lab): s for lab, s in later.get("shared", [])},
            allocated={_gref(lab): s for lab, s in later.get("allocated", [])},
            containers=containers,
            container_stats=stats,
            pods=pods,
            idle_signal=idle_signal,
            signals=signals,
            evidence=_evidence(later.get("evidence", [])),
            held_usage=usage,
            held_signal=usage_signal,
            queries=len(queries) + len(more),
        )

    def _history_start(self, window: Window, first: float | None) -> float:
        """Where the verdicts' history begins: a rate over the range r is the mean over r
        only once a series is r old (before, Prometheus divides what little increase there
        is by all of r), so the rate-based verdicts' history begins r after the data does."""
        if first is None:
            return window.end
        rate_range = max(window.step, self.lookback)
        return min(window.end, max(window.start, first - window.step + rate_range))

    def node_queries(self, node: str, window: Window) -> dict[str, str]:
        node = validate_node(node)
        r = self._r(window)
        util = selector("gpu_utilization_ratio", node=node)
        mem = selector("gpu_memory_used_bytes", node=node)
        cutil = selector("container_gpu_utilization_ratio", {"namespace": '!=""'}, node=node)
        info = selector("gpu_info", node=node)
        limit = selector("gpu_power_limit_watts", node=node)
        throttle = selector("gpu_throttle_seconds_total", node=node)
        match = {"node": f'="{escape_label_value(node)}"'}
        return {
            "utilization": f"max by (gpu) (avg_over_time({util}[{r}]))",
            "memory": f"max by (gpu) (avg_over_time({mem}[{r}]))",
            "containers": (
                f"max by (namespace, pod, container, gpu) (avg_over_time({cutil}[{r}])"
                f" * on (node, uuid) group_left (gpu) max by (node, uuid, gpu) ({info}))"
            ),
            "activity": " or ".join(
                f'label_replace({_rate(f"gpu_{name}_active_seconds_total", r, match, "gpu")},'
                f' "signal", "{name}", "", "")' for name in ("sm", "tensor", "dram")
            ),
            "power": (f"max by (gpu) ({_power_step(r, match, 'node, gpu, uuid')}"
                      f" / on (node, uuid) group_left () max by (node, uuid) ({limit}))"),
            "throttle": f"max by (gpu, reason) (rate({throttle}[{r}]))",
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
                f"{lab.get('namespace')}/{lab.get('pod')}/{lab.get('container')}"
                f" (GPU {lab.get('gpu')})": s
                for lab, s in res["containers"]
            },
            sm=activity.get("sm", {}), tensor=activity.get("tensor", {}),
            dram=activity.get("dram", {}),
            power_ratio={lab.get("gpu", ""): s for lab, s in res["power"]},
            throttle={f"{lab.get('gpu', '')} {lab.get('reason', '')}": s
                      for lab, s in res["throttle"]},
            queries=len(queries),
        )

    def workload_queries(self, namespace: str, workload: str, window: Window,
                         uuids: Sequence[str] = ()) -> dict[str, str]:
        """The devices of one workload (``members``: an instant query over the window), and
        the utilization, SM activity and power per step of ``uuids`` of them
        (``workload``)."""
        namespace, workload = validate_namespace(namespace), validate_workload(workload)
        r = self._r(window)
        w = duration(window.seconds)
        cutil = selector("container_gpu_utilization_ratio", namespace=namespace)
        pods = selector("gpu_pod_info", namespace=namespace, workload=workload)
        out = {
            "members": (
                f"max by (node, uuid, pod) (last_over_time({cutil}[{w}])"
                f" * on (node, namespace, pod) group_left ()"
                f" max by (node, namespace, pod) (last_over_time({pods}[{w}])))"
                f" * 0 + on (node, uuid) group_left (gpu, model)"
                f" max by (node, uuid, gpu, model) (gpu_info)"),
        }
        if uuids:
            match = {"uuid": f'=~"{any_of(sorted(set(uuids)))}"'}
            out["workload"] = " or ".join([
                f'label_replace({_util_step(r, match)}, "signal", "utilization", "", "")',
                f'label_replace({_rate("gpu_sm_active_seconds_total", r, match)},'
                f' "signal", "sm", "", "")',
                f'label_replace({_power_step(r, match)}, "signal", "power", "", "")',
            ])
        return out

    def workload_detail(self, namespace: str, workload: str, window_seconds: float,
                        first: Collection[GpuRef] = ()) -> WorkloadDetail:
        window = self.window(window_seconds)
        members = self.instant(self.workload_queries(namespace, workload, window)["members"],
                               window.end)
        pods: dict[GpuRef, set[str]] = {}
        index: dict[GpuRef, tuple[str, str]] = {}
        for lab, _ in members:
            ref = _gref(lab)
            pods.setdefault(ref, set()).add(lab.get("pod", ""))
            index[ref] = (lab.get("gpu", ""), lab.get("model", ""))
        devices = pick_devices(
            [WorkloadDevice(ref, index[ref][0], index[ref][1], tuple(sorted(pods[ref])))
             for ref in pods], first)
        queries = self.workload_queries(namespace, workload, window,
                                        [d.ref.uuid for d in devices])
        by_signal: dict[str, dict[GpuRef, Series]] = {}
        if "workload" in queries:
            shown = {d.ref for d in devices}
            for lab, s in self.range(queries["workload"], window):
                if _gref(lab) in shown:
                    by_signal.setdefault(lab.get("signal", ""), {})[_gref(lab)] = s
        return WorkloadDetail(
            namespace=namespace, workload=workload, window=window, devices=devices,
            utilization=by_signal.get("utilization", {}), sm=by_signal.get("sm", {}),
            power=by_signal.get("power", {}), queries=len(queries), total_devices=len(pods),
        )

    def pod_queries(self, namespace: str, pod: str, window: Window) -> dict[str, str]:
        namespace, pod = validate_namespace(namespace), validate_pod(pod)
        r = duration(max(window.step, self.lookback))
        util = selector("container_gpu_utilization_ratio", namespace=namespace, pod=pod)
        mem = selector("container_gpu_memory_used_bytes", namespace=namespace, pod=pod)
        by = "node, container, gpu"
        join = " * on (node, uuid) group_left (gpu) max by (node, uuid, gpu) (gpu_info)"
        return {
            "utilization": f"max by ({by}) (avg_over_time({util}[{r}]){join})",
            "memory": f"max by ({by}) (avg_over_time({mem}[{r}]){join})",
        }

    def pod_detail(self, namespace: str, pod: str, window_seconds: float) -> PodDetail:
        window = self.window(window_seconds)
        queries = self.pod_queries(namespace, pod, window)
        futures = {k: self._pool.submit(self.range, q, window) for k, q in queries.items()}
        res = {k: f.result() for k, f in futures.items()}

        def key(lab: Mapping[str, str]) -> str:
            return f"{lab.get('container')} ({lab.get('node')} GPU {lab.get('gpu')})"

        return PodDetail(
            namespace=namespace, pod=pod, window=window,
            utilization={key(lab): s for lab, s in res["utilization"]},
            memory_used={key(lab): s for lab, s in res["memory"]},
            queries=len(queries),
        )


