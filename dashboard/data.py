"""Data access: the only module that talks to Prometheus or scrapes exporters.

Three sources behind one :class:`DataSource` protocol, all returning the same
:class:`~gpuscope.dashboard.series.FleetData` / ``NodeDetail`` / ``PodDetail``:

- :class:`PrometheusData` (``--prometheus URL``): any Prometheus-compatible HTTP API. Every
  aggregation happens server-side (``max by``, ``avg_over_time`` ... per step, one point
  per step and series), so a fleet of thousands of GPUs costs a fixed handful of queries
  of bounded size. User input reaches PromQL only validated *and* escaped
  (:func:`escape_label_value`, :func:`selector`).
- :class:`EmbeddedData` (``--targets URL,...``): scrapes exporters directly into a bounded
  in-memory window (one ring per series, bounded by age and by point count, and a cap on
  the number of series), adding the ``node`` label the exporter leaves to the scraper.
- the demo (``--demo``, :mod:`gpuscope.dashboard.demo`) runs simulated exporters in-process and an
  :class:`EmbeddedData` on them.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from gpuscope.dashboard.analysis import Thresholds
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

log = logging.getLogger(__name__)

INFO_LOOKBACK = 300.0  # like Prometheus' lookback delta: an info series older than this is gone


class DataError(Exception):
    """The backend failed (unreachable, slow, an error answer); ``str()`` is one line."""


class InvalidFilter(ValueError):
    """A filter value (namespace, node, pod) that is not a valid Kubernetes name."""


# -- PromQL safety ---------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
# Kubernetes names: a namespace is a DNS label; pods and nodes are DNS subdomains. Node names
# from --targets hints may also be IP addresses (v4 or v6) or upper case host names.
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NODE = re.compile(r"^[A-Za-z0-9:]([A-Za-z0-9._:-]{0,251}[A-Za-z0-9])?$")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_label_value(value: str) -> str:
    """``value`` as the inside of a double-quoted PromQL string literal.

    Backslash and double quote are escaped, newline/CR/tab get their escapes and every other
    control character ``\\uXXXX``, so no input can close the literal and append PromQL.
    """
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def selector(metric: str, matchers: Mapping[str, str] | None = None, **equal: str) -> str:
    """``metric{label="value", ...}`` with every value escaped.

    ``matchers`` maps label names to raw PromQL matcher suffixes built by this module only
    (e.g. ``'!=""'``); ``equal`` are user-facing equality matchers, escaped here.
    """
    if not _METRIC_NAME.match(metric):
        raise ValueError(f"bad metric name {metric!r}")
    parts = []
    for name, op in (matchers or {}).items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f"{name}{op}")
    for name, value in equal.items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f'{name}="{escape_label_value(value)}"')
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def validate_namespace(value: str) -> str:
    value = value.strip()
    if not _NAMESPACE.match(value):
        raise InvalidFilter(f"not a Kubernetes namespace name: {value[:80]!r}")
    return value


def validate_pod(value: str) -> str:
    value = value.strip()
    if not _POD.match(value):
        raise InvalidFilter(f"not a Kubernetes pod name: {value[:80]!r}")
    return value


def validate_node(value: str) -> str:
    value = value.strip()
    if not _NODE.match(value):
        raise InvalidFilter(f"not a node name: {value[:80]!r}")
    return value


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$-")


def _any_of(values: Sequence[str]) -> str:
    """A PromQL regex matcher body (already escaped for the string literal) matching exactly
    one of ``values``: regex metacharacters escaped first, then the literal escaping."""
    alternatives = ("".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in v)
                    for v in values)
    return escape_label_value("|".join(alternatives))


def _duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# -- windows ---------------------------------------------------------------------------------


def make_window(
    window_seconds: float, end: float, *, min_step: float, max_points: int
) -> Window:
    """A window whose step divides it evenly: ``window / n`` with ``n`` <= ``max_points``
    steps of at least ``min_step`` seconds (Prometheus' and our buckets then coincide)."""
    if window_seconds <= 0:
        raise ValueError("window must be positive")
    n = max(1, min(max_points, math.floor(window_seconds / min_step)))
    end = round(end, 3)  # whole milliseconds: the resolution of Prometheus' timestamps
    return Window(start=end - window_seconds, end=end, step=window_seconds / n)


# -- the protocol ----------------------------------------------------------------------------


class DataSource(Protocol):
    """What the views need, whatever the backend."""

    @property
    def description(self) -> str: ...

    def fleet(self, window_seconds: float, namespace: str | None = None) -> FleetData: ...

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail: ...

    def pod_detail(self, namespace: str, pod: str, window_seconds: float) -> PodDetail: ...

    def close(self) -> None: ...


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
        r = _duration(max(window.step, self.lookback))
        w = _duration(window.seconds)
        s = _duration(window.step)
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
        r = _duration(max(window.step, self.lookback))
        w = _duration(window.seconds)
        out = {}
        candidates = sorted(set(candidate_uuids))
        if candidates:
            match = {"uuid": f'=~"{_any_of(candidates)}"'}
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
            alloc = selector("container_gpu_allocated", {"node": f'=~"{_any_of(nodes)}"'})
            out["allocated"] = f"max by (node, uuid) (max_over_time({alloc}[{r}]))"
        uuids = sorted(set(shared_uuids))
        if uuids:
            util = selector("gpu_utilization_ratio", {"uuid": f'=~"{_any_of(uuids)}"'})
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
        r = _duration(max(window.step, self.lookback))
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
        r = _duration(max(window.step, self.lookback))
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


# -- embedded scraping -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """An exporter to scrape; ``node`` is the value of the ``node`` label its series get."""

    url: str
    node: str


def parse_targets(text: str) -> tuple[Target, ...]:
    """``URL[,URL...]``, each optionally ``NODE=URL``.

    Without a ``NODE=`` hint the node is the URL's host (``http://10.0.0.5:9463/metrics``
    -> ``10.0.0.5``): the exporter does not know its node name as a label (the scrape adds
    it), so name the node when the host is not the Kubernetes node name. A URL without a
    path gets ``/metrics``.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("expected one or more exporter URLs")
    targets: list[Target] = []
    for item in items:
        node: str | None = None
        url = item
        head, sep, rest = item.partition("=")
        if sep and "://" not in head:
            node, url = head.strip(), rest.strip()
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s) URL such as http://10.0.0.5:9463/metrics, "
                             f"got {url!r}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        if not parts.path or parts.path == "/":
            url = urllib.parse.urlunsplit(parts._replace(path="/metrics"))
        try:
            node = validate_node(node if node is not None else parts.hostname)
        except InvalidFilter as exc:
            raise ValueError(f"{item!r}: {exc}") from None
        if any(t.url == url for t in targets):
            raise ValueError(f"duplicate target {url!r}")
        targets.append(Target(url=url, node=node))
    return tuple(targets)


# Series the embedded store keeps as time series, and those it keeps as "last seen" only.
RING_METRICS = frozenset({
    "gpu_utilization_ratio", "gpu_memory_used_bytes", "container_gpu_allocated",
    "container_gpu_utilization_ratio", "container_gpu_memory_used_bytes",
})
INFO_METRICS = frozenset({"gpu_info", "gpu_node_info", "gpu_pod_info"})

Sample = tuple[str, Mapping[str, str], float]


class _Ring:
    """Times and values of one series in two float arrays (16 bytes a point), oldest first."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times = array("d")
        self.values = array("d")

    def append(self, t: float, v: float, capacity: int) -> None:
        if self.times and t <= self.times[-1]:
            return  # out of order or repeated: keep the series monotonic
        self.times.append(t)
        self.values.append(v)
        excess = len(self.times) - capacity
        if excess > max(1, capacity // 8):  # trim in chunks: amortised O(1)
            del self.times[:excess]
            del self.values[:excess]

    def trim_before(self, t: float) -> None:
        i = bisect.bisect_left(self.times, t)
        if i:
            del self.times[:i]
            del self.values[:i]

    def points(self, after: float, until: float, capacity: int) -> tuple[list[float], list[float]]:
        """Points with ``after < t <= until`` among the newest ``capacity``."""
        lo = max(bisect.bisect_right(self.times, after), len(self.times) - capacity)
        hi = bisect.bisect_right(self.times, until)
        return list(self.times[lo:hi]), list(self.values[lo:hi])


def _bucket(
    times: Sequence[float], values: Sequence[float], evals: Sequence[float], rng: float,
    how: Callable[[Sequence[float]], float],
) -> Series:
    """Per evaluation time ``e``, ``how`` of the values in ``(e - rng, e]`` (like
    ``*_over_time(x[rng])`` in a range query); times without samples are left out."""
    out_t: list[float] = []
    out_v: list[float] = []
    for e in evals:
        lo = bisect.bisect_right(times, e - rng)
        hi = bisect.bisect_right(times, e)
        if hi > lo:
            out_t.append(e)
            out_v.append(how(values[lo:hi]))
    return Series(tuple(out_t), tuple(out_v))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _stats(values: Sequence[float], memory: float) -> UtilStats:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return UtilStats(mean, math.sqrt(var), n, memory)


@dataclass(slots=True)
class _TargetState:
    target: Target
    last_success: float | None = None
    last_error: str = ""


class EmbeddedData:
    """Scrapes exporters every ``interval`` seconds into a bounded in-memory store.

    Bounds: each series keeps at most ``capacity`` points and none older than ``max_age``
    seconds; at most ``max_series`` series are kept (new ones beyond that are dropped and
    counted). Memory is about 16 bytes x points x series, e.g. 2,000 series x 1,440 points
    = 46 MB at worst. History starts empty: verdicts say how much they rest on.
    """

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        interval: float = 15.0,
        capacity: int = 1440,
        max_age: float = 7 * 86400.0,
        max_series: int = 20000,
        max_points: int = 120,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        label: str | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.targets = tuple(targets)
        self.interval = interval
        self.capacity = capacity
        self.max_age = max_age
        self.max_series = max_series
        self.max_points = max_points
        self.timeout = timeout
        self._clock = clock
        self._label = label
        self._lock = threading.Lock()
        self._rings: dict[tuple[str, Labels], _Ring] = {}
        self._info: dict[tuple[str, Labels], float] = {}
        self._first: float | None = None
        self.dropped_series = 0
        self._state = {t.url: _TargetState(t) for t in self.targets}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(16, len(self.targets))), thread_name_prefix="scrape"
        )
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def description(self) -> str:
        if self._label:
            return self._label
        n = len(self.targets)
        return f"embedded scraping of {n} exporter{'s' if n != 1 else ''}"

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, node: str, samples: Iterable[Sample], timestamp: float) -> None:
        """Store one scrape's samples of ``node`` taken at ``timestamp``."""
        with self._lock:
            if self._first is None or timestamp < self._first:
                self._first = timestamp
            for name, labels, value in samples:
                if name in INFO_METRICS:
                    key = (name, self._key(labels, node))
                    self._info[key] = max(timestamp, self._info.get(key, 0.0))
                    continue
                if name not in RING_METRICS or math.isnan(value):
                    continue
                key = (name, self._key(labels, node))
                ring = self._rings.get(key)
                if ring is None:
                    if len(self._rings) >= self.max_series:
                        self.dropped_series += 1
                        continue
                    ring = self._rings[key] = _Ring()
                ring.append(timestamp, value, self.capacity)

    @staticmethod
    def _key(labels: Mapping[str, str], node: str) -> Labels:
        return tuple(sorted({**labels, "node": node}.items()))

    def ingest_text(self, node: str, text: str, timestamp: float) -> None:
        """Store one scrape in the Prometheus text format."""
        samples = [
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
        self.ingest(node, samples, timestamp)

    def expire(self, now: float) -> None:
        """Drop points older than ``max_age`` and series left without points."""
        cutoff = now - self.max_age
        with self._lock:
            for key in list(self._rings):
                ring = self._rings[key]
                ring.trim_before(cutoff)
                if not ring.times:
                    del self._rings[key]
            for key, seen in list(self._info.items()):
                if seen < cutoff:
                    del self._info[key]
            if self._first is not None and self._first < cutoff:
                self._first = cutoff

    # -- scraping --------------------------------------------------------------------------
    def scrape_once(self) -> None:
        """Scrape every target once (concurrently) and store what came back."""
        futures = [self._pool.submit(self._scrape, t) for t in self.targets]
        for f in futures:
            f.result()
        self.expire(self._clock())

    def _scrape(self, target: Target) -> None:
        state = self._state[target.url]
        started = self._clock()
        try:
            req = urllib.request.Request(target.url, headers={"Accept": "text/plain"})
            with self._opener.open(req, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8")
            self.ingest_text(target.node, text, started)
        except Exception as exc:  # any failure marks the target down; the loop goes on
            state.last_error = str(getattr(exc, "reason", exc)) or type(exc).__name__
            log.debug("scrape of %s failed: %s", target.url, state.last_error)
            return
        state.last_success = started
        state.last_error = ""

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="gpuscope-scrape", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.scrape_once()
            except Exception:
                log.exception("scrape round failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def target_notes(self, now: float) -> tuple[str, ...]:
        down = []
        for state in self._state.values():
            stale = state.last_success is None or now - state.last_success > 3 * self.interval
            if stale and (state.last_error or state.last_success is not None):
                down.append(f"{state.target.node} ({state.target.url}): "
                            f"{state.last_error or 'no recent scrape'}")
        notes = []
        if down:
            notes.append(f"{len(down)} of {len(self.targets)} exporters not answering: "
                         + "; ".join(down))
        if self.dropped_series:
            notes.append(f"{self.dropped_series} series dropped (more than "
                         f"{self.max_series} series)")
        return tuple(notes)

    # -- queries ---------------------------------------------------------------------------
    def window(self, window_seconds: float) -> Window:
        return make_window(window_seconds, self._clock(), min_step=self.interval,
                           max_points=self.max_points)

    def _select(
        self, name: str, window: Window, rng: float, **match: str
    ) -> list[tuple[dict[str, str], list[float], list[float]]]:
        """Points of the ``name`` series matching ``match`` in ``(start - rng, end]``."""
        out = []
        with self._lock:
            for (metric, labels), ring in self._rings.items():
                if metric != name:
                    continue
                lab = dict(labels)
                if any(lab.get(k) != v for k, v in match.items()):
                    continue
                times, values = ring.points(window.start - rng, window.end, self.capacity)
                if times:
                    out.append((lab, times, values))
        return out

    def _infos(self, name: str, since: float) -> list[dict[str, str]]:
        with self._lock:
            return [dict(labels) for (metric, labels), seen in self._info.items()
                    if metric == name and seen >= since]

    def fleet(self, window_seconds: float, namespace: str | None = None) -> FleetData:
        if namespace is not None:
            namespace = validate_namespace(namespace)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        lookback = window.end - max(INFO_LOOKBACK, 3 * self.interval)

        gpus = {}
        for lab in self._infos("gpu_info", lookback):
            info = GpuInfo(lab["node"], lab.get("gpu", ""), lab.get("uuid", ""),
                           lab.get("model", ""), lab.get("parent_uuid", ""),
                           lab.get("mig_profile", ""))
            gpus[info.ref] = info
        nodes = {
            lab["node"]: NodeInfo(lab["node"], lab.get("instance_type", ""), lab.get("zone", ""),
                                  lab.get("capacity_type", ""))
            for lab in self._infos("gpu_node_info", lookback)
        }

        def gref(lab: Mapping[str, str]) -> GpuRef:
            return GpuRef(lab["node"], lab.get("uuid", ""))

        def cref(lab: Mapping[str, str]) -> ContainerRef:
            return ContainerRef(lab["node"], lab.get("namespace", ""), lab.get("pod", ""),
                                lab.get("container", ""), lab.get("uuid", ""))

        busy_max: dict[GpuRef, Series] = {}
        gpu_mean: dict[GpuRef, float] = {}
        step_mean: dict[GpuRef, Series] = {}
        gpu_now: dict[GpuRef, float] = {}
        for lab, times, values in self._select("gpu_utilization_ratio", window, rng):
            ref = gref(lab)
            busy_max[ref] = series = _bucket(times, values, evals, rng, max)
            if series.times and series.times[-1] >= window.end - 1e-9:
                gpu_now[ref] = series.values[-1]
            step_mean[ref] = _bucket(times, values, evals, rng, _mean)
            lo = bisect.bisect_right(times, window.start)
            if lo < len(times):
                gpu_mean[ref] = _mean(values[lo:])

        holders: dict[GpuRef, set[ContainerRef]] = {}
        alloc_points: dict[GpuRef, tuple[list[float], list[float]]] = {}
        for lab, times, values in self._select("container_gpu_allocated", window, rng):
            holder = cref(lab)
            if holder.namespace:
                holders.setdefault(holder.gpu, set()).add(holder)
            merged = alloc_points.setdefault(holder.gpu, ([], []))
            merged[0].extend(times)
            merged[1].extend(values)
        allocated = {}
        for gpu, (times, values) in alloc_points.items():
            order = sorted(range(len(times)), key=times.__getitem__)
            allocated[gpu] = _bucket([times[i] for i in order], [values[i] for i in order],
                                     evals, rng, max)
        shared = {g for g, refs in holders.items() if len(refs) >= 2}

        containers: dict[ContainerRef, Series] = {}
        raw: dict[ContainerRef, list[float]] = {}
        for lab, times, values in self._select("container_gpu_utilization_ratio", window, rng):
            user = cref(lab)
            if not user.namespace:
                continue
            containers[user] = _bucket(times, values, evals, rng, _mean)
            lo = bisect.bisect_right(times, window.start)
            if lo < len(times):
                raw[user] = values[lo:]
        if namespace is not None:
            touched = {ref.gpu for ref in containers if ref.namespace == namespace}
            containers = {ref: s for ref, s in containers.items() if ref.gpu in touched}
        memory: dict[ContainerRef, float] = {}
        for lab, times, values in self._select("container_gpu_memory_used_bytes", window, rng):
            lo = bisect.bisect_right(times, window.start)
            if lo < len(times):
                memory[cref(lab)] = max(values[lo:])
        stats = {
            ref: _stats(values, memory.get(ref, 0.0)) for ref, values in raw.items()
            if namespace is None or ref.namespace == namespace
        }
        pods = {}
        for lab in self._infos("gpu_pod_info", window.start):
            if namespace is not None and lab.get("namespace") != namespace:
                continue
            key = PodKey(lab["node"], lab.get("namespace", ""), lab.get("pod", ""))
            pods[key] = PodInfo(key.node, key.namespace, key.pod, lab.get("workload", ""))

        with self._lock:
            first = self._first
        history_start = window.end if first is None else max(window.start, first)
        return FleetData(
            window=window,
            history_start=history_start,
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max=busy_max,
            gpu_now=gpu_now,
            gpu_mean=gpu_mean,
            gpu_step_mean={g: s for g, s in step_mean.items() if g in shared},
            allocated=allocated,
            containers=containers,
            container_stats=stats,
            pods=pods,
            queries=0,
            notes=self.target_notes(window.end),
        )

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        node = validate_node(node)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        index = {lab.get("uuid", ""): lab.get("gpu", "")
                 for lab in self._infos("gpu_info", window.start) if lab["node"] == node}

        def by_gpu(name: str) -> dict[str, Series]:
            return {lab.get("gpu", ""): _bucket(t, v, evals, rng, _mean)
                    for lab, t, v in self._select(name, window, rng, node=node)}

        containers = {}
        for lab, t, v in self._select("container_gpu_utilization_ratio", window, rng, node=node):
            if not lab.get("namespace"):
                continue
            gpu = index.get(lab.get("uuid", ""), lab.get("uuid", "")[-8:])
            name = f"{lab['namespace']}/{lab.get('pod')}/{lab.get('container')} (GPU {gpu})"
            containers[name] = _bucket(t, v, evals, rng, _mean)
        return NodeDetail(node=node, window=window,
                          utilization=by_gpu("gpu_utilization_ratio"),
                          memory_used=by_gpu("gpu_memory_used_bytes"),
                          containers=containers)

    def pod_detail(self, namespace: str, pod: str, window_seconds: float) -> PodDetail:
        namespace, pod = validate_namespace(namespace), validate_pod(pod)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        index = {(lab["node"], lab.get("uuid", "")): lab.get("gpu", "")
                 for lab in self._infos("gpu_info", window.start)}

        def series(name: str) -> dict[str, Series]:
            out = {}
            for lab, t, v in self._select(name, window, rng, namespace=namespace, pod=pod):
                gpu = index.get((lab["node"], lab.get("uuid", "")), "?")
                out[f"{lab.get('container')} ({lab['node']} GPU {gpu})"] = _bucket(
                    t, v, evals, rng, _mean)
            return out

        return PodDetail(namespace=namespace, pod=pod, window=window,
                         utilization=series("container_gpu_utilization_ratio"),
                         memory_used=series("container_gpu_memory_used_bytes"))
