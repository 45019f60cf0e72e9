"""``--prometheus URL``: any Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, ...).

Every aggregation happens server-side (``max by``, ``avg_over_time`` ... per step, one point
per step and series), so a fleet of thousands of GPUs costs a fixed handful of queries of
bounded size. User input reaches PromQL only validated *and* escaped (:mod:`.promql`)."""


from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gpuscope.dashboard.analysis import Thresholds
from gpuscope.dashboard.data.promql import any_of, duration, selector
from gpuscope.dashboard.data.source import (
    DataError,
    make_window,
    validate_namespace,
    validate_node,
    validate_pod,
)
from gpuscope.dashboard.series import (
    ContainerRef,
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
)

# -- Prometheus ------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


def _labels(metric: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in metric.items() if k != "__name__"}


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
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.min_step = min_step
        self.max_points = max_points
        self.lookback = lookback
        self.thresholds = thresholds or Thresholds()
        self.idle_threshold = self.thresholds.idle_utilization
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promql")
        self._opener = urllib.request.build_opener()
        self.queries_total = 0
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        return f"Prometheus {self.url}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- HTTP ------------------------------------------------------------------------------
    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(
            self.url + path, data=body, method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded",
                     "Accept": "application/json"},
        )
        with self._lock:
            self.queries_total += 1
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, OSError, AttributeError):
                detail = ""
            raise DataError(f"{self.description}: HTTP {exc.code} {detail}".strip()) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DataError(f"{self.description} unreachable: {reason}") from None
        except ValueError:
            raise DataError(f"{self.description}: answer is not JSON") from None
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error") if isinstance(payload, dict) else payload
            raise DataError(f"{self.description}: query failed: {error}")
        return payload["data"]

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

    def fleet_queries(self, window: Window, namespace: str | None) -> dict[str, str]:
        """The fleet page's first round of PromQL, by role; :attr:`RANGE_QUERIES` are range
        queries over the window, the others instant queries at its end. A second round
        (:meth:`second_round`) asks only about the devices the first one singled out."""
        r = duration(max(window.step, self.lookback))
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
        return {
            "gpus": "max by (node, gpu, uuid, model, parent_uuid, mig_profile) (gpu_info)",
            "nodes": "max by (node, instance_type, zone, capacity_type) (gpu_node_info)",
            # Only the idle steps come back: busy steps are what most of a fleet is made of.
            "idle_steps": f"max by ({gby}) (max_over_time({util}[{r}])) < {self.idle_threshold!r}",
            "gpu_stats": " or ".join([
                f'label_replace(avg by ({gby}) (avg_over_time({util}[{w}])),'
                f' "stat", "mean", "", "")',
                f'label_replace(max by ({gby}) (max_over_time({util}[{r}])),'
                f' "stat", "now", "", "")',
                # When data begins: the first step at which any device reported.
                f'label_replace(min_over_time(timestamp(count({util}))[{w}:{s}]),'
                f' "stat", "first", "", "")',
            ]),
            "containers": f"max by ({cby}) (avg_over_time({cutil}[{r}])){ns_filter}",
            "pods": f"max by (node, namespace, pod, workload) (last_over_time({pods}[{w}]))",
        }

    RANGE_QUERIES = frozenset({"idle_steps", "containers", "allocated", "shared"})
    INSTANT_QUERIES = frozenset({"gpus", "nodes", "gpu_stats", "pods", "stats"})

    def second_round(
        self, window: Window, idle_nodes: Iterable[str], shared_uuids: Iterable[str],
        candidate_uuids: Iterable[str], namespace: str | None = None,
    ) -> dict[str, str]:
        """Allocation of the devices on nodes idle right now (the waste split), the
        utilization of devices shared by several containers (time-slicing starvation), and
        raw-sample statistics of the containers on devices where one looks input-starved."""
        r = duration(max(window.step, self.lookback))
        w = duration(window.seconds)
        out = {}
        candidates = sorted(set(candidate_uuids))
        if candidates:
            match = {"uuid": f'=~"{any_of(candidates)}"'}
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
        nodes = sorted(set(idle_nodes))
        if nodes:
            alloc = selector("container_gpu_allocated", {"node": f'=~"{any_of(nodes)}"'})
            out["allocated"] = f"max by (node, uuid) (max_over_time({alloc}[{r}]))"
        uuids = sorted(set(shared_uuids))
        if uuids:
            util = selector("gpu_utilization_ratio", {"uuid": f'=~"{any_of(uuids)}"'})
            out["shared"] = f"max by (node, gpu, uuid) (avg_over_time({util}[{r}]))"
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

        def gref(lab: Mapping[str, str]) -> GpuRef:
            return GpuRef(lab.get("node", ""), lab.get("uuid", ""))

        def cref(lab: Mapping[str, str]) -> ContainerRef:
            return ContainerRef(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""),
                                lab.get("container", ""), lab.get("uuid", ""))

        gpu_mean: dict[GpuRef, float] = {}
        gpu_now: dict[GpuRef, float] = {}
        first: float | None = None
        for lab, v in results["gpu_stats"]:
            stat = lab.get("stat")
            if stat == "mean":
                gpu_mean[gref(lab)] = v
            elif stat == "now":
                gpu_now[gref(lab)] = v
            elif stat == "first" and math.isfinite(v):
                first = v
        containers = {cref(lab): s for lab, s in results["containers"] if lab.get("namespace")}

        # Second round: only what the first singled out.
        idle_now: dict[str, bool] = {}
        for info in gpus.values():
            if info.is_physical:
                now = gpu_now.get(info.ref)
                idle_now[info.node] = idle_now.get(info.node, True) and (
                    now is not None and now < self.idle_threshold)
        sharers: dict[GpuRef, int] = {}
        for ref in containers:
            sharers[ref.gpu] = sharers.get(ref.gpu, 0) + 1
        # Input starvation needs raw-sample statistics; ask only where the per-step means
        # put a container's mean in the suspicious range (with a margin for the
        # difference between the mean of step means and the mean of raw samples).
        th = self.thresholds
        candidates = [
            ref.uuid for ref, series in containers.items()
            if series.values and (namespace is None or ref.namespace == namespace)
            and th.input_low * 0.5 < sum(series.values) / len(series.values)
            < min(1.0, th.input_high * 1.5)
        ]
        more = self.second_round(
            window, (n for n, idle in idle_now.items() if idle),
            (g.uuid for g, n in sharers.items() if n >= 2), candidates, namespace,
        )
        later = self._run(more, window) if more else {}

        stats_parts: dict[ContainerRef, dict[str, float]] = {}
        for lab, v in later.get("stats", []):
            stats_parts.setdefault(cref(lab), {})[lab.get("stat", "")] = v
        stats = {
            ref: UtilStats(
                mean=p.get("mean", 0.0), stddev=p.get("stddev", 0.0),
                samples=int(p.get("count", 0)), memory_bytes=p.get("memory", 0.0),
            )
            for ref, p in stats_parts.items() if "mean" in p
        }
        pods = {}
        for lab, _ in results["pods"]:
            key = PodKey(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""))
            pods[key] = PodInfo(key.node, key.namespace, key.pod, lab.get("workload", ""))
        history_start = (window.end if first is None
                         else max(window.start, first - window.step))
        return FleetData(
            window=window,
            history_start=history_start,
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max={gref(lab): s for lab, s in results["idle_steps"]},
            gpu_now=gpu_now,
            gpu_mean=gpu_mean,
            gpu_step_mean={gref(lab): s for lab, s in later.get("shared", [])},
            allocated={gref(lab): s for lab, s in later.get("allocated", [])},
            containers=containers,
            container_stats=stats,
            pods=pods,
            queries=len(queries) + len(more),
        )

    def node_queries(self, node: str, window: Window) -> dict[str, str]:
        node = validate_node(node)
        r = duration(max(window.step, self.lookback))
        util = selector("gpu_utilization_ratio", node=node)
        mem = selector("gpu_memory_used_bytes", node=node)
        cutil = selector("container_gpu_utilization_ratio", {"namespace": '!=""'}, node=node)
        info = selector("gpu_info", node=node)
        return {
            "utilization": f"max by (gpu) (avg_over_time({util}[{r}]))",
            "memory": f"max by (gpu) (avg_over_time({mem}[{r}]))",
            "containers": (
                f"max by (namespace, pod, container, gpu) (avg_over_time({cutil}[{r}])"
                f" * on (node, uuid) group_left (gpu) max by (node, uuid, gpu) ({info}))"
            ),
        }

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        window = self.window(window_seconds)
        queries = self.node_queries(node, window)
        futures = {k: self._pool.submit(self.range, q, window) for k, q in queries.items()}
        res = {k: f.result() for k, f in futures.items()}
        return NodeDetail(
            node=node, window=window,
            utilization={lab.get("gpu", ""): s for lab, s in res["utilization"]},
            memory_used={lab.get("gpu", ""): s for lab, s in res["memory"]},
            containers={
                f"{lab.get('namespace')}/{lab.get('pod')}/{lab.get('container')}"
                f" (GPU {lab.get('gpu')})": s
                for lab, s in res["containers"]
            },
            queries=len(queries),
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


