"""``--targets URL,...`` (and the demo): scrape exporters directly.

The samples go into a bounded in-memory window (one ring per series, bounded by age and by
point count, and a cap on the number of series), with the ``node`` label the exporter leaves
to the scraper added here: the node the exporter states in ``gpu_node_info{node_name}``,
unless the target was given a name; for an exporter that states none, the target's host (or
``host:port`` when hosts repeat). Two targets never share a node."""


from __future__ import annotations

import bisect
import logging
import operator
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.data.reduce import (
    bucket,
    cref,
    evidence,
    gref,
    holdings,
    increase_bucket,
    mean_of,
    merged,
    rate_bucket,
    slice_holder_lines,
    uncarved,
    util_stats,
    work_signals,
)
from gpuscope.dashboard.data.ring import Ring
from gpuscope.dashboard.data.source import (
    INFO_LOOKBACK,
    InvalidFilter,
    make_window,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.data.steps import StepQuery, ranges
from gpuscope.dashboard.data.targets import (
    NODE_NAME_LABEL,
    Sample,
    Target,
    TargetState,
    parse_page,
    scrape,
    stated_node,
)
from gpuscope.dashboard.series import (
    ContainerRef,
    FleetData,
    GpuInfo,
    GpuRef,
    HeldSteps,
    NodeDetail,
    NodeInfo,
    PodDetail,
    PodInfo,
    Series,
    Window,
    WorkloadDetail,
    WorkloadDevice,
    pick_devices,
    presence,
)

#: The stragglers' default duration (``verdicts.stragglers.STRAGGLER_DURATION``, which a test
#: keeps equal): how far back the stragglers' evidence looks.
STRAGGLER_DURATION = 10 * 60.0

log = logging.getLogger(__name__)

# Series the embedded store keeps as time series, and those it keeps as "last seen" only.
WORK_COUNTERS = frozenset({
    "gpu_busy_seconds_total", "gpu_sm_active_seconds_total", "gpu_tensor_active_seconds_total",
    "gpu_dram_active_seconds_total", "gpu_energy_joules_total", "gpu_throttle_seconds_total",
})
FLEET_METRICS = frozenset({
    "gpu_utilization_ratio", "gpu_memory_used_bytes", "container_gpu_allocated",
    "container_gpu_utilization_ratio", "container_gpu_memory_used_bytes", "gpu_power_watts",
    "gpu_power_limit_watts", "gpu_sm_clock_hertz", "gpu_temperature_celsius", *WORK_COUNTERS,
    # A GPU's mode: one in MIG mode with no slice is idle (``uncarved``, :meth:`fleet`).
    "gpu_sharing_info",
})
NODE_METRICS = FLEET_METRICS
WORKLOAD_METRICS = frozenset({
    "gpu_utilization_ratio", "gpu_busy_seconds_total", "gpu_sm_active_seconds_total",
    "gpu_energy_joules_total", "gpu_power_watts", "gpu_power_limit_watts",
})
RING_METRICS = FLEET_METRICS
Labels = tuple[tuple[str, str], ...]

INFO_METRICS = frozenset({"gpu_info", "gpu_node_info", "gpu_pod_info"})


class EmbeddedData:
    """Scrapes exporters every ``interval`` seconds into a bounded in-memory store.

    Bounds: each series keeps at most ``capacity`` points and none older than ``max_age``
    seconds; at most ``max_series`` series are kept (new ones beyond that are dropped and
    counted). Memory is about 16 bytes x points x series, e.g. 2,000 series x 1,440 points
    = 46 MB at worst. History starts empty: verdicts say how much they rest on.

    The series kept are those of :data:`RING_METRICS` and of ``extra_metrics`` (the metrics
    that the verdicts' :class:`~.steps.StepQuery` read, :meth:`step_series`), within the
    same ``max_series``.
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
        notes: Sequence[str] = (),
        straggler_duration: float = STRAGGLER_DURATION,
        extra_metrics: Collection[str] = (),
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        if isinstance(extra_metrics, str):
            raise ValueError("extra_metrics: a collection of metric names, not one string")
        for name in extra_metrics:
            StepQuery(name, "max", ">", 0.0)  # ValueError for a bad metric name
            if name in INFO_METRICS:
                raise ValueError(f"{name} is kept as an info series, not as a time series")
        self.targets = tuple(targets)
        self.interval = interval
        self.capacity = capacity
        self.max_age = max_age
        self.max_series = max_series
        self.max_points = max_points
        self.timeout = timeout
        self._clock = clock
        self._label = label
        self.notes = tuple(notes)
        self.straggler_duration = straggler_duration
        #: The metrics kept as time series.
        self.ring_metrics = RING_METRICS | frozenset(extra_metrics)
        self._lock = threading.Lock()
        self._rings: dict[tuple[str, Labels], Ring] = {}
        self._info: dict[tuple[str, Labels], float] = {}
        self._first: float | None = None  # where history begins: first scrape, oldest kept
        self.dropped_series = 0
        # Each sample's stored key, by its node and labels as scraped: a scrape repeats the
        # last one's label sets, and building each key anew made filling the demo's hour of
        # past take 18.2 s instead of 15.5 s (2 cores, mean of 3). Emptied when it outgrows
        # the series, so churn cannot grow it.
        self._keys: dict[tuple[str, tuple[tuple[str, str], ...]], Labels] = {}
        # Each time series' ring, by its name, node and labels as scraped: one lookup per
        # sample instead of its stored key and then its ring (the demo's hour of past is
        # 1.4 M such samples). Holds only rings in ``_rings``: emptied when ``expire`` drops
        # one, and when it outgrows the series (the same labels scraped in another order).
        self._routes: dict[tuple[str, str, tuple[tuple[str, str], ...]], Ring] = {}
        # Each node's last scrape: the name, labels and ring of its time series' samples, in
        # order. A scrape repeats the last one's series in the same order, so a sample is
        # matched with the one at its place by comparing its labels (a tenth of building
        # the lookup above); one that does not match is looked up. Emptied with ``_routes``.
        self._layouts: dict[str, list[tuple[str, Mapping[str, str], Ring]]] = {}
        self._state = {t.url: TargetState(t, t.node) for t in self.targets}
        # Which target each node name belongs to: two targets must never merge into one node
        # (a planted idle node would hide behind a busy one). Names given by hand are taken
        # from the start; the others as targets first use them (see _node_of).
        self._claims: dict[str, str] = {t.node: t.url for t in self.targets if t.named}
        self._warned: set[tuple[str, str]] = set()
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
        """Store one scrape's samples of ``node`` taken at ``timestamp``. The labels of the
        node's last scrape are kept (to match the next one's with): a caller does not change
        a mapping it has passed."""
        ring_metrics = self.ring_metrics
        routes = self._routes
        capacity = self.capacity
        with self._lock:
            if self._first is None or timestamp < self._first:
                self._first = timestamp
            last = self._layouts.get(node, [])
            layout: list[tuple[str, Mapping[str, str], Ring]] = []
            for name, labels, value in samples:
                if name not in ring_metrics:
                    if name in INFO_METRICS:
                        key = (name, self._key(labels, node))
                        self._info[key] = max(timestamp, self._info.get(key, 0.0))
                    continue
                if value != value:  # NaN (math.isnan without a call per sample): no point
                    continue
                at = len(layout)
                if at < len(last) and last[at][0] == name and last[at][1] == labels:
                    ring = last[at][2]
                else:
                    found = routes.get((name, node, tuple(labels.items())))
                    if found is None:
                        found = self._ring(name, labels, node)
                        if found is None:
                            continue
                    ring = found
                layout.append((name, labels, ring))
                times = ring.times
                # Ring.append inlined while the ring has room (nothing to trim, nor to move
                # the history's start): the method call was a fifth of the ingest's time.
                if len(times) < capacity:
                    if times and timestamp <= times[-1]:
                        continue  # out of order or repeated: keep the series monotonic
                    times.append(timestamp)
                    ring.values.append(value)
                    continue
                ring.append(timestamp, value, capacity)
                if len(times) > capacity and times[-capacity] > self._first:
                    self._first = times[-capacity]  # oldest one served
            self._layouts[node] = layout

    def _ring(self, name: str, labels: Mapping[str, str], node: str) -> Ring | None:
        """The ring of the series ``name`` of ``node`` with ``labels`` (made if new), or None
        when the store holds ``max_series`` already (counted in ``dropped_series``)."""
        key = (name, self._key(labels, node))
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= self.max_series:
                self.dropped_series += 1
                return None
            ring = self._rings[key] = Ring()
        if len(self._routes) >= 2 * self.max_series:
            self._routes.clear()
        self._routes[(name, node, tuple(labels.items()))] = ring
        return ring

    def _key(self, labels: Mapping[str, str], node: str) -> Labels:
        """The stored key of a sample of ``node`` with ``labels``: sorted, with ``node``."""
        seen = (node, tuple(labels.items()))
        key = self._keys.get(seen)
        if key is None:
            if len(self._keys) >= 2 * self.max_series:
                self._keys.clear()
            # The stated node name becomes ``node`` (as the scrape config's relabeling does
            # in Prometheus); kept as well, it would split a node's info across exporter
            # versions.
            lab = {k: v for k, v in labels.items() if k != NODE_NAME_LABEL}
            lab["node"] = node
            key = self._keys[seen] = tuple(sorted(lab.items()))
        return key

    def ingest_text(self, node: str, text: str, timestamp: float) -> None:
        """Store one scrape in the Prometheus text format."""
        self.ingest(node, parse_page(text), timestamp)

    def expire(self, now: float) -> None:
        """Drop points older than ``max_age`` and series left without points."""
        cutoff = now - self.max_age
        with self._lock:
            for key in list(self._rings):
                ring = self._rings[key]
                ring.trim_before(cutoff)
                if not ring.times:
                    del self._rings[key]
                    self._routes.clear()  # they may lead to the ring just dropped
                    self._layouts.clear()
            for key, seen in list(self._info.items()):
                if seen < cutoff:
                    del self._info[key]
            if self._first is not None and self._first < cutoff:
                self._first = cutoff

    # -- scraping --------------------------------------------------------------------------
    def scrape_once(self) -> None:
        """Scrape every target once (concurrently) and store what came back.

        Node names are settled in the order of the targets, not of the answers, so that
        when two exporters state the same name, which one keeps it does not depend on
        which answered first."""
        futures = [(t, self._pool.submit(self._scrape, t)) for t in self.targets]
        for target, future in futures:
            scraped = future.result()
            if scraped is not None:
                started, samples = scraped
                self.ingest(self._node_of(target, samples), samples, started)
        self.expire(self._clock())

    def _scrape(self, target: Target) -> tuple[float, list[Sample]] | None:
        """One target's samples and when the scrape began; None when it failed."""
        state = self._state[target.url]
        started = self._clock()
        samples = scrape(self._opener, state, self.timeout)
        if samples is None:
            return None
        state.last_success = started
        return started, samples

    def _node_of(self, target: Target, samples: Sequence[Sample]) -> str:
        """The node a scrape of ``target`` is stored under: the name given for the target,
        else the one its exporter states, else the fallback from its URL; and never a name
        another target holds (then ``<name>_<host:port>``, noted once)."""
        state = self._state[target.url]
        if target.named:
            return target.node
        want = target.node
        stated = stated_node(samples)
        if stated is not None:
            try:
                want = validate_node(stated)
            except InvalidFilter:
                self._warn_once(target, stated, f"{target.url} states a node name the "
                                f"dashboard cannot use ({stated[:80]!r}); shown as {want}")
        with self._lock:
            node, holder = want, self._claims.get(want, target.url)
            if holder != target.url:
                node = f"{want}_{target.address}"
                if self._claims.get(node, target.url) != target.url:  # same host:port too
                    node = f"{node}_{self.targets.index(target) + 1}"
            if state.node != node and self._claims.get(state.node) == target.url:
                del self._claims[state.node]  # the exporter now names another node
            self._claims[node] = target.url
            state.node = node
        if holder != target.url:
            state.clash = (f"two exporters state node {want!r}: {holder} keeps the name, "
                           f"{target.url} is shown as {node}")
            self._warn_once(target, want, state.clash)
        else:
            state.clash = ""
        return node

    def _warn_once(self, target: Target, name: str, message: str) -> None:
        if (target.url, name) not in self._warned:
            self._warned.add((target.url, name))
            log.warning("%s", message)

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
                down.append(f"{state.node} ({state.target.url}): "
                            f"{state.last_error or 'no recent scrape'}")
        notes = []
        if down:
            notes.append(f"{len(down)} of {len(self.targets)} exporters not answering: "
                         + "; ".join(down))
        notes.extend(state.clash for state in self._state.values() if state.clash)
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
        return self._select_many((name,), window, rng, **match).get(name, [])

    def _select_many(
        self, names: Iterable[str], window: Window, rng: float, **match: str
    ) -> dict[str, list[tuple[dict[str, str], list[float], list[float]]]]:
        """:meth:`_select` of several metrics in one pass over the store."""
        wanted = frozenset(names)
        out: dict[str, list[tuple[dict[str, str], list[float], list[float]]]] = {}
        with self._lock:
            for (metric, labels), ring in self._rings.items():
                if metric not in wanted:
                    continue
                lab = dict(labels)
                if any(lab.get(k) != v for k, v in match.items()):
                    continue
                times, values = ring.points(window.start - rng, window.end, self.capacity)
                if times:
                    out.setdefault(metric, []).append((lab, times, values))
        return out

    def _rate_range(self, window: Window) -> float:
        """A rate needs two samples in its range whatever the scrapes' jitter: three scrape
        intervals at least (like Prometheus' range of at least 60 s at 15 s scrapes)."""
        return max(window.step, 3 * self.interval)

    def _infos(self, name: str, since: float) -> list[dict[str, str]]:
        with self._lock:
            return [dict(labels) for (metric, labels), seen in self._info.items()
                    if metric == name and seen >= since]

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        if namespace is not None:
            namespace = validate_namespace(namespace)
        window = window or self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        lookback = window.end - max(INFO_LOOKBACK, 3 * self.interval)
        sel = self._select_many(FLEET_METRICS, window, max(rng, self._rate_range(window)))

        infos = (GpuInfo.of(lab) for lab in self._infos("gpu_info", lookback))
        gpus = {info.ref: info for info in infos}
        nodes = {lab["node"]: NodeInfo.of(lab) for lab in self._infos("gpu_node_info", lookback)}
        slices = {ref for ref, info in gpus.items() if not info.is_physical}
        signals = work_signals(sel, window, evals, rng, self._rate_range(window),
                                throttle_rates=False)

        # Idle activity: utilization (whole GPUs, slices that report it), SM activity (MIG
        # slices with GPM), else whether a process holds memory on the slice; a whole GPU
        # in MIG mode with no slice: 0 (it can run nothing).
        busy_max: dict[GpuRef, Series] = {}
        idle_signal: dict[GpuRef, str] = {}
        gpu_now: dict[GpuRef, float] = {}
        gauges: dict[GpuRef, tuple[list[float], list[float]]] = {}
        # The steps at which each node's exporter was there (any of its devices reported):
        # the time a node that came up or went away within the window is charged for.
        there: dict[str, set[float]] = {}
        # The steps at which each device reported (a MIG slice: its GPU has a slice then).
        reported: dict[GpuRef, tuple[float, ...]] = {}
        for lab, times, values in sel.get("gpu_utilization_ratio", []):
            ref = gref(lab)
            gauges[ref] = (times, values)
            series = bucket(times, values, evals, rng, max)
            reported[ref] = series.times
            there.setdefault(ref.node, set()).update(series.times)
            if series.times and series.times[-1] >= window.end - 1e-9:
                gpu_now[ref] = series.values[-1]
            if ref in slices and ref in signals.gpm:
                continue
            busy_max[ref] = series
            idle_signal[ref] = "utilization"
        for ref in slices & signals.gpm:
            busy_max[ref] = signals.sm[ref]
            idle_signal[ref] = "sm"
        process_memory: dict[GpuRef, Series] = merged(
            ((gref(lab), t, v) for lab, t, v in sel.get("container_gpu_memory_used_bytes", [])),
            evals, rng, max)
        for lab, times, values in sel.get("gpu_memory_used_bytes", []):
            ref = gref(lab)
            if ref in gauges:
                continue
            present = bucket(times, values, evals, rng, max)
            there.setdefault(ref.node, set()).update(present.times)
            reported[ref] = present.times
            if ref not in slices or ref in signals.gpm:
                continue
            used = process_memory[ref].at() if ref in process_memory else {}
            busy_max[ref] = Series(present.times, tuple(
                1.0 if used.get(t, 0.0) > 0 else 0.0 for t in present.times))
            idle_signal[ref] = "process"

        for ref, series in uncarved(sel.get("gpu_sharing_info", []),
                                    {ref: reported[ref] for ref in gauges}, reported,
                                    self._infos("gpu_info", window.start - rng),
                                    evals, rng).items():
            busy_max[ref] = series
            idle_signal[ref] = "mig"

        gpu_mean: dict[GpuRef, float] = {}
        for ref, series in signals.utilization.items():
            if series.values:
                gpu_mean[ref] = mean_of(series.values)
        step_mean = {ref: bucket(t, v, evals, rng, mean_of) for ref, (t, v) in gauges.items()}

        held: dict[ContainerRef, Series] = {}
        alloc_points: list[tuple[GpuRef, list[float], list[float]]] = []
        for lab, times, values in sel.get("container_gpu_allocated", []):
            holder = cref(lab)
            if holder.namespace:
                held[holder] = bucket(times, values, evals, rng, max)
            alloc_points.append((holder.gpu, times, values))
        allocated = merged(alloc_points, evals, rng, max)

        containers: dict[ContainerRef, Series] = {}
        container_max: dict[ContainerRef, Series] = {}
        raw: dict[ContainerRef, list[float]] = {}
        for lab, times, values in sel.get("container_gpu_utilization_ratio", []):
            user = cref(lab)
            if not user.namespace:
                continue
            containers[user] = bucket(times, values, evals, rng, mean_of)
            container_max[user] = bucket(times, values, evals, rng, max)
            lo = bisect.bisect_right(times, window.start)
            if lo < len(times):
                raw[user] = values[lo:]
        # The time-sliced devices: those two containers or more used in the window (as the
        # Prometheus plan's ``members`` say), whether or not the kubelet allocated it to
        # each (a pod that sees every GPU runs on one it does not hold).
        users: dict[GpuRef, int] = {}
        for user in containers:
            users[user.gpu] = users.get(user.gpu, 0) + 1
        shared = {g for g, n in users.items() if n >= 2}
        memory: dict[ContainerRef, float] = {}
        memory_steps: dict[ContainerRef, Series] = {}
        for lab, times, values in sel.get("container_gpu_memory_used_bytes", []):
            user = cref(lab)
            memory_steps[user] = bucket(times, values, evals, rng, max)
            lo = bisect.bisect_right(times, window.start)
            if lo < len(times):
                memory[user] = max(values[lo:])
        # Who held what: every container's, whatever the namespace (the showback's totals).
        pods_seen = (PodInfo.of(lab) for lab in self._infos("gpu_pod_info", window.start))
        every_pod = {pod.key: pod for pod in pods_seen}
        held_by = holdings(held, containers, every_pod, slices, window)
        if namespace is not None:
            touched = {ref.gpu for ref in containers if ref.namespace == namespace}
            containers = {ref: s for ref, s in containers.items() if ref.gpu in touched}
        stats = {
            ref: util_stats(values, memory.get(ref, 0.0)) for ref, values in raw.items()
            if namespace is None or ref.namespace == namespace
        }
        pods = {key: info for key, info in every_pod.items()
                if namespace is None or key.namespace == namespace}

        with self._lock:
            first = self._first
        history_start = window.end if first is None else max(window.start, first)
        counts = {node: sum(1 for t in steps if t > history_start - 1e-9)
                  for node, steps in there.items()}
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
            idle_signal=idle_signal,
            signals=signals,
            evidence=evidence(sel, window, min(self.straggler_duration, window.seconds)),
            held_steps=HeldSteps(held, container_max, memory_steps),
            holdings=held_by,
            holdings_step=window.step,
            present=presence(counts, window.step, max(0.0, window.end - history_start)),
            queries=0,
            notes=(*self.notes, *self.target_notes(window.end)),
        )

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        node = validate_node(node)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        infos = [lab for lab in self._infos("gpu_info", window.start) if lab["node"] == node]
        index = {lab.get("uuid", ""): lab.get("gpu", "") for lab in infos}
        slices = {lab.get("uuid", "") for lab in infos if lab.get("parent_uuid")}
        sel = self._select_many(NODE_METRICS, window, max(rng, self._rate_range(window)), node=node)

        def by_gpu(name: str) -> dict[str, Series]:
            return {lab.get("gpu", ""): bucket(t, v, evals, rng, mean_of)
                    for lab, t, v in sel.get(name, [])}

        containers = {}
        for lab, t, v in sel.get("container_gpu_utilization_ratio", []):
            if not lab.get("namespace"):
                continue
            gpu = index.get(lab.get("uuid", ""), lab.get("uuid", "")[-8:])
            name = f"{lab['namespace']}/{lab.get('pod')}/{lab.get('container')} (GPU {gpu})"
            containers[name] = bucket(t, v, evals, rng, mean_of)
        signals = work_signals(sel, window, evals, rng, self._rate_range(window))
        gpu_of = {GpuRef(node, uuid): gpu for uuid, gpu in index.items()}

        def named(m: Mapping[GpuRef, Series]) -> dict[str, Series]:
            return {gpu_of.get(ref, ref.uuid[-8:]): s for ref, s in m.items()}

        held: dict[tuple[str, str], Series] = {}
        for lab, t, v in sel.get("container_gpu_allocated", []):
            if lab.get("namespace") and lab.get("uuid", "") in slices:
                steps = bucket(t, v, evals, rng, max)
                kept = [i for i, x in enumerate(steps.values) if x > 0]
                held[(f"{lab['namespace']}/{lab.get('pod')}/{lab.get('container')}",
                      index[lab["uuid"]])] = Series(tuple(steps.times[i] for i in kept),
                                                    tuple(1.0 for _ in kept))
        containers.update(slice_holder_lines(held, named(signals.sm)))

        power_ratio = {}
        for ref, s in signals.power.items():
            limit = signals.power_limit.get(ref)
            if limit:
                power_ratio[gpu_of.get(ref, ref.uuid[-8:])] = Series(
                    s.times, tuple(v / limit for v in s.values))
        throttle = {f"{gpu_of.get(ref, ref.uuid[-8:])} {reason}": s
                    for ref, reasons in signals.throttle.items() for reason, s in reasons.items()}
        # Utilization as the fleet page and the workload view read it: the busy counter's
        # rate per step (the exact mean), else the gauge's mean.
        return NodeDetail(node=node, window=window,
                          utilization=named(signals.utilization),
                          memory_used=by_gpu("gpu_memory_used_bytes"),
                          containers=containers, sm=named(signals.sm),
                          tensor=named(signals.tensor), dram=named(signals.dram),
                          power_ratio=power_ratio, throttle=throttle)

    def workload_detail(self, namespace: str, workload: str, window_seconds: float,
                        first: Collection[GpuRef] = (), cluster: str | None = None
                        ) -> WorkloadDetail:
        namespace, workload = validate_namespace(namespace), validate_workload(workload)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        pods = {(lab["node"], lab.get("pod", ""))
                for lab in self._infos("gpu_pod_info", window.start)
                if lab.get("namespace") == namespace and lab.get("workload") == workload
                and (cluster is None or node_parts(lab["node"])[0] == cluster)}
        on: dict[GpuRef, set[str]] = {}
        # The devices its containers used or held: a MIG slice has no per-container
        # utilization (NVML gives none per process there), its holder is on it all the same.
        used_or_held = self._select_many(
            ("container_gpu_utilization_ratio", "container_gpu_allocated"), window, rng,
            namespace=namespace)
        for name, rows in used_or_held.items():
            for lab, _, values in rows:
                if ((lab["node"], lab.get("pod", "")) in pods
                        and (name != "container_gpu_allocated" or max(values) > 0)):
                    on.setdefault(gref(lab), set()).add(lab.get("pod", ""))
        info = {(lab["node"], lab.get("uuid", "")): lab
                for lab in self._infos("gpu_info", window.start)}
        devices = pick_devices(
            [WorkloadDevice(ref, info.get((ref.node, ref.uuid), {}).get("gpu", ""),
                            info.get((ref.node, ref.uuid), {}).get("model", ""),
                            tuple(sorted(on[ref])))
             for ref in on], first)
        shown = {d.ref for d in devices}
        sel = self._select_many(WORKLOAD_METRICS, window, max(rng, self._rate_range(window)))
        sel = {name: [(lab, t, v) for lab, t, v in rows if gref(lab) in shown]
               for name, rows in sel.items()}
        signals = work_signals(sel, window, evals, rng, self._rate_range(window))
        return WorkloadDetail(namespace=namespace, workload=workload, window=window,
                              devices=devices, utilization=signals.utilization,
                              sm=signals.sm, power=signals.power, total_devices=len(on))

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        namespace, pod = validate_namespace(namespace), validate_pod(pod)
        window = self.window(window_seconds)
        rng = max(window.step, 2 * self.interval)
        evals = window.times()
        index = {(lab["node"], lab.get("uuid", "")): lab.get("gpu", "")
                 for lab in self._infos("gpu_info", window.start)}

        def series(name: str) -> dict[str, Series]:
            out = {}
            for lab, t, v in self._select(name, window, rng, namespace=namespace, pod=pod):
                if cluster is not None and node_parts(lab["node"])[0] != cluster:
                    continue
                gpu = index.get((lab["node"], lab.get("uuid", "")), "?")
                out[f"{lab.get('container')} ({lab['node']} GPU {gpu})"] = bucket(
                    t, v, evals, rng, mean_of)
            return out

        return PodDetail(namespace=namespace, pod=pod, window=window,
                         utilization=series("container_gpu_utilization_ratio"),
                         memory_used=series("container_gpu_memory_used_bytes"))

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """Each query's kept steps on the fleet page's grid (:meth:`window`), computed from
        the stored series as :func:`.steps.promql` asks Prometheus for them, with two scrape
        intervals for Prometheus' ``lookback``: ``min``/``max`` over the step (at least two
        intervals), ``increase`` over that and two intervals before it, without Prometheus'
        extrapolation (a rise of 1 is 1 here, about 1.07 there at a 15 s scrape: the same
        steps pass ``> 0``, a threshold between the two values would not). Series that
        differ only in labels left out of ``by`` are aggregated as there (lowest, highest,
        sum).

        Labels: ``node`` and the query's ``by`` labels the series has (an empty one left
        out, as Prometheus leaves it out). A query with ``on`` keeps a step of a series only
        where a query of its ``on`` kept that step for a series of the same ``node`` and
        ``uuid`` (one without ``uuid`` matching one without it, as ``and on (node, uuid)``
        does); with ``slices``, also where one kept that step for the GPU of the series'
        MIG slice (``gpu_info`` seen in the window), such a series labelled with its
        ``parent_uuid``; a series left without steps is left out. ValueError for a metric this store
        does not keep (not in :data:`RING_METRICS` nor ``extra_metrics``: it would read as
        healthy)."""
        metrics = {m for q in queries for m in q.metrics}
        unknown = sorted(metrics - self.ring_metrics)
        if unknown:
            raise ValueError(f"not kept by the embedded store: {', '.join(unknown)} (pass "
                             f"them in extra_metrics)")
        window = window or self.window(window_seconds)
        evals = window.times()
        gauge, counter = ranges(window.step, 2 * self.interval)
        sel = self._select_many(metrics, window, counter)
        done: dict[StepQuery, list[tuple[dict[str, str], Series]]] = {}

        def kept(q: StepQuery) -> list[tuple[dict[str, str], Series]]:
            """``q``'s kept steps, without its ``on`` (each query computed once)."""
            if q in done:
                return done[q]
            combine: Callable[[float, float], float] = (
                min if q.reduce == "min" else operator.add if q.reduce == "increase" else max)
            groups: dict[Labels, dict[float, float]] = {}
            for lab, times, values in sel.get(q.metric, []):
                if not q.wants(lab):
                    continue
                key = tuple((k, lab[k]) for k in q.labels if lab.get(k))
                if q.reduce == "increase":
                    series = increase_bucket(times, values, evals, counter)
                elif q.reduce == "rate":
                    series = rate_bucket(times, values, evals, counter)
                else:
                    series = bucket(times, values, evals, gauge, min if q.reduce == "min"
                                     else max)
                points = groups.setdefault(key, {})
                for t, v in zip(series.times, series.values, strict=True):
                    points[t] = combine(points[t], v) if t in points else v
            rows = []
            for key, points in sorted(groups.items()):
                steps = [(t, points[t]) for t in sorted(points) if q.passes(points[t])]
                if steps:
                    rows.append((dict(key), Series(tuple(t for t, _ in steps),
                                                   tuple(v for _, v in steps))))
            done[q] = rows
            return rows

        known: dict[tuple[str, str], str] = {}

        def parents() -> dict[tuple[str, str], str]:
            """Each MIG slice's GPU, (node, slice uuid) -> uuid, from the ``gpu_info`` seen
            in the window (kept as last seen only; a slice's uuid names one GPU)."""
            if not known:
                for lab in self._infos("gpu_info", window.start - gauge):
                    if lab.get("parent_uuid") and lab.get("uuid"):
                        known[(lab.get("node", ""), lab["uuid"])] = lab["parent_uuid"]
            return known

        out: dict[StepQuery, list[tuple[dict[str, str], Series]]] = {}
        for q in queries:
            if q in out:
                continue
            if not q.on:
                out[q] = kept(q)
                continue
            flagged = {(lab["node"], lab.get("uuid", ""), t)
                       for other in q.on for lab, s in kept(other) for t in s.times}
            rows = []
            for lab, s in kept(q.bare):
                device = (lab["node"], lab.get("uuid", ""))
                on = [(t, v) for t, v in zip(s.times, s.values, strict=True)
                      if (*device, t) in flagged]
                if on:
                    rows.append((lab, Series(tuple(t for t, _ in on),
                                             tuple(v for _, v in on))))
                parent = parents().get(device) if q.slices else None
                on = [(t, v) for t, v in zip(s.times, s.values, strict=True)
                      if parent and (lab["node"], parent, t) in flagged]
                if on:
                    rows.append(({**lab, "parent_uuid": parent or ""},
                                 Series(tuple(t for t, _ in on), tuple(v for _, v in on))))
            out[q] = rows
        return out
