"""``--prometheus URL``: any Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, ...).

Every aggregation happens server-side (``max by``, ``avg_over_time`` ... per step, one point
per step and series), so a fleet of thousands of GPUs costs a fixed handful of queries of
bounded size. User input reaches PromQL only validated *and* escaped (:mod:`.promql`)."""


from __future__ import annotations

import json
import math
import textwrap
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from gpuscope.dashboard.data.http import PromApi, reject_credentials_in_url
from gpuscope.dashboard.data.promql import (
    any_of,
    duration,
    escape_label_value,
    labelled,
    selector,
)
from gpuscope.dashboard.data.source import (
    DataError,
    make_window,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.data.steps import STEP_LABEL, StepQuery, combined
from gpuscope.dashboard.data.steps import promql as step_promql
from gpuscope.dashboard.series import (
    MAX_HEATMAP_NODES,
    ContainerRef,
    Evidence,
    FleetData,
    GpuInfo,
    GpuRef,
    NodeDetail,
    NodeInfo,
    NodeSummary,
    PodDetail,
    PodInfo,
    PodKey,
    Series,
    UtilStats,
    Window,
    WorkloadDetail,
    WorkloadDevice,
    WorkSignals,
    gc_paused,
    pick_devices,
    summary_mean,
)

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.verdicts.stragglers import GroupKey

# The Prometheus planner below still judges in PromQL with the verdicts' thresholds and
# groups (issue 29's open layering: the data layer is to import nothing above it). Until it
# is gone, the verdict layer is imported where it is used, not when this module loads: the
# verdict modules import this package's step queries, and a module-level import here would
# close an import cycle.


def _thresholds() -> Thresholds:
    from gpuscope.dashboard.verdicts import Thresholds
    return Thresholds()

# -- Prometheus ------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


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
    """Per step, the mean rate of a counter (the mean of the activity it integrates), from
    the steps at which the series is at least ``r`` old: before, Prometheus divides what
    little increase there is by all of ``r`` and the rate reads low (a busy GPU would look
    idle, a working one spinning), so those steps are left out."""
    sel = selector(metric, match)
    return (f"(max by ({by}) (rate({sel}[{r}]))"
            f" and on ({by}) max by ({by}) ({sel} offset {r}))")


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


def _stat(expr: str, name: str) -> str:
    """One part of a query of several, its rows labelled ``stat="name"``."""
    return labelled(expr, "stat", name)


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
        ref = _gref(lab)
        mine = parts.get(ref)
        if mine is None:  # (not ``setdefault``: 10^4 rows, a few per device)
            mine = parts[ref] = {"throttle": {}}
        stat = lab.get("stat")
        if stat == "throttle":
            mine["throttle"][lab.get("reason", "")] = v
        elif stat in ("sm_clock", "temperature"):
            mine[stat] = v
    return {ref: Evidence(p["throttle"], p.get("sm_clock"), p.get("temperature"))
            for ref, p in parts.items()}


#: The ``gpuscope-dashboard`` recording rules (alerts/gpuscope-rules.yaml), evaluated every
#: :data:`RULE_INTERVAL` seconds: per device and container, the signals of one minute
#: (dense), and what meets a verdict's rule in that minute (sparse: a series only while
#: it does). Their expressions are :func:`recording_rules`, the raw queries' own.
RULES = {
    "util_max": "uuid:gpu_utilization_ratio:max1m",
    "util": "uuid:gpu_busy_ratio:rate2m",
    "sm": "uuid:gpu_sm_active_ratio:rate2m",
    "tensor": "uuid:gpu_tensor_active_ratio:rate2m",
    "dram": "uuid:gpu_dram_active_ratio:rate2m",
    "power": "uuid:gpu_power_watts:rate2m",
    "cutil": "container:gpu_utilization_ratio:avg1m",
    "idle": "uuid:gpu_idle_activity:ratio1m",
    "spin": "uuid:gpu_spinning_utilization:ratio1m",
    "throttling": "uuid:gpu_throttle_any_ratio:rate2m",
    "silent": "uuid:gpu_silent:info1m",
    "held_idle": "container:gpu_held_idle_usage:ratio1m",
    "workload": "uuid:gpu_workload_utilization:sum1m",
    "candidates": "workload:gpu_straggler_candidates:count1m",
    "stalled_median": "workload:gpu_workload_utilization:median1m",
    "stalled": "uuid:gpu_stalled_utilization:ratio1m",
    "group_work": "uuid:gpu_group_work:avg1m",
    "work_median": "workload:gpu_work:median1m",
    "slow": "uuid:gpu_slow_work:ratio1m",
    # Per node (5,000 series at 5,000 nodes where the devices' are 35,000): what the fleet
    # page needs of the nodes where no verdict has anything to show (NodeSummary).
    "node_gpus": "node:gpu_whole:count1m",
    "node_models": "node:gpu_model:count1m",
    "node_util_sum": "node:gpu_busy_ratio:sum1m",
    "node_util_count": "node:gpu_busy_ratio:count1m",
    # Who uses what over the default window (:data:`LEAN_WINDOW`), so that the page need not
    # read every container's series: each container's raw mean over the last hour (dense,
    # read by the two after it alone), the containers whose mean is near the input-starved
    # range and the devices two containers or more used (sparse).
    "cmean": "container:gpu_utilization_ratio:avg1h",
    "input_range": "container:gpu_input_range:avg1h",
    "sharers": "uuid:gpu_sharers:count1h",
    "version": "gpuscope:dashboard_rules:version",
}
#: The rules' version, recorded as ``gpuscope:dashboard_rules:version``: raised whenever a
#: release adds a recorded series the page reads, so that a rule file older than the page
#: (which lacks it: sparse series cannot tell "nothing met the rule" from "not recorded")
#: leaves the page to the raw series instead of to a silent gap. The series carries the
#: thresholds the rules were made for (label ``thresholds``: ``Thresholds.key``): the page
#: reads only rules made for its own.
RULES_VERSION = 4
RULE_INTERVAL = 60.0
#: A step's window: its ``step`` seconds less a millisecond. Prometheus 2 takes the samples
#: of ``[t - d, t]`` (both ends), VictoriaMetrics those of ``(t - d, t]``: a sample exactly
#: on the step before would count twice on one store and once on the other.
EDGE = 0.001
#: The window whose containers the rules describe (the page's default, an hour): over it the
#: page reads who uses what on the nodes that need it only (:meth:`PrometheusData.lean`).
#: The page reads the last minute recorded, up to a minute before its end: a container
#: seen only in that last minute, or only in the window's first, is missed there (too
#: short for any verdict; a device shared only then lacks its row in the shares' table).
LEAN_WINDOW = 3600.0
#: How far outside the input-starved range a container's recorded mean may be and still be
#: asked about: the recorded hour and the page's differ by at most a minute at each end and
#: a sample on the boundary, 3 samples of 60 at a one-minute scrape, so the means by at most
#: 0.05. The page judges the exact mean of its own window. A mean of 0 is never asked about
#: (strictly above the bound): an hour at exactly 0 is not input-starved a minute later.
INPUT_MARGIN = 0.05
#: The rules' windows: a minute for gauges, two for counters (a rate needs two samples, and a
#: one-minute scrape gives one per minute).
RULE_R = duration(RULE_INTERVAL - EDGE)
RULE_RR = duration(2 * RULE_INTERVAL - EDGE)

_NO_POINTS = Series((), ())
NOT_EMPTY = '!=""'
CBY = "node, namespace, pod, container, uuid"
GBY = "node, gpu, uuid"
#: A straggler group: the devices of one workload and GPU model (:mod:`..analysis.stragglers`).
GROUP = "namespace, workload, model"
#: One device of a straggler group.
MEMBER = f"node, uuid, {GROUP}"


class _Steps:
    """Per step, each device's and container's signals on the nodes ``match`` names (all
    without it): gauges over ``r``, counters' rates over ``rr`` (two scrape intervals at
    least). From the raw series, or (``rules``) the ``gpuscope-dashboard`` recording rules:
    the mean (``avg_over_time``) or highest (``max_over_time``) of the step's minutes,
    the same values as the raw ones when the step is a minute and the rules were evaluated
    on the step's times (approximately so otherwise)."""

    def __init__(self, r: str, rr: str, rules: bool = False,
                 match: Mapping[str, str] | None = None) -> None:
        self.r = r
        self.rr = rr
        self.rules = rules
        self.match = dict(match or {})

    def sel(self, metric: str, extra: Mapping[str, str] | None = None) -> str:
        """``metric`` on this step's nodes, with ``extra`` matchers."""
        return selector(metric, {**self.match, **(extra or {})})

    def _recorded(self, fn: str, key: str, by: str = GBY) -> str:
        return f"max by ({by}) ({fn}({self.sel(RULES[key])}[{self.r}]))"

    def util_max(self) -> str:
        """The highest utilization sample in the step (a step is idle when below)."""
        if self.rules:
            return self._recorded("max_over_time", "util_max")
        return f"max by ({GBY}) (max_over_time({self.sel('gpu_utilization_ratio')}[{self.r}]))"

    def util(self) -> str:
        """Mean utilization: busy counter, else the gauge."""
        if self.rules:
            return self._recorded("avg_over_time", "util")
        return _util_step(self.rr, self.match)

    def active(self, name: str) -> str:
        """GPM ``sm``/``tensor``/``dram`` activity."""
        if self.rules:
            return self._recorded("avg_over_time", name)
        return _rate(f"gpu_{name}_active_seconds_total", self.rr, self.match)

    def power(self) -> str:
        """Mean watts: energy counter, else the gauge."""
        if self.rules:
            return self._recorded("avg_over_time", "power")
        return _power_step(self.rr, self.match)

    def limit(self) -> str:
        return f"max by ({GBY}) (max_over_time({self.sel('gpu_power_limit_watts')}[{self.r}]))"

    def workload(self, compute: bool = False, model: bool = False) -> str:
        """Per device and workload (``node, uuid, namespace, workload``), the summed
        utilization of the workload's containers on the device (``compute``: from the
        containers' signals even with ``rules``, as the rule recording it does, with the
        device's ``model``). ``model``: with the device's GPU model (from ``gpu_info``, ""
        where it has none): per device of each straggler group (:data:`MEMBER`)."""
        by = MEMBER if model else "node, uuid, namespace, workload"
        if self.rules and not compute:
            return self._recorded("avg_over_time", "workload", by)
        pods = self.sel("gpu_pod_info", {"workload": NOT_EMPTY})
        mine = (f"sum by (node, uuid, namespace, workload) ({self.cutil()}"
                f" * on (node, namespace, pod) group_left (workload)"
                f" topk by (node, namespace, pod) (1, {pods}))")
        if not (model or compute):
            return mine
        info = self.sel("gpu_info")
        models = f"topk by (node, uuid) (1, max by (node, uuid, model) ({info}))"
        return (f"({mine} * on (node, uuid) group_left (model) {models}"
                f" or {mine} unless on (node, uuid) {info})")

    def cutil(self) -> str:
        """Each container's mean utilization of each device it uses."""
        if self.rules:
            return self._recorded("avg_over_time", "cutil", CBY)
        cutil = self.sel("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})
        return f"max by ({CBY}) (avg_over_time({cutil}[{self.r}]))"


class Verdicts:
    """The verdicts' rules as PromQL over :class:`_Steps`: what meets each at a step. The
    fleet page applies them to the window's end (what to ask the history of) and, without
    the recording rules, per step; the ``gpuscope-dashboard`` rules record them every
    minute (:func:`recording_rules`)."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.th = thresholds

    def idle_parts(self, st: _Steps) -> list[str]:
        """Each device's idle activity below the threshold, labelled with its ``signal``:
        utilization (whole GPUs, slices that report it without GPM), SM activity (MIG slices
        with GPM), or (a MIG slice without either) 0 while no process holds memory on it.
        A device meets at most one of them."""
        idle = f"{self.th.idle_utilization!r}"
        util = st.sel("gpu_utilization_ratio")
        gpm = st.sel("gpu_sm_active_seconds_total")
        slices = st.sel("gpu_info", {"parent_uuid": NOT_EMPTY})
        cmem = st.sel("container_gpu_memory_used_bytes")
        memory = st.sel("gpu_memory_used_bytes")
        return [
            f'label_replace({st.util_max()} < {idle}'
            f' unless on (node, uuid) ({gpm} and on (node, uuid) {slices}),'
            f' "signal", "utilization", "", "")',
            f'label_replace({st.active("sm")} < {idle}'
            f' and on (node, uuid) {slices}, "signal", "sm", "", "")',
            f'label_replace(max by ({GBY}) (max_over_time({memory}[{st.r}]))'
            f' * 0 and on (node, uuid) {slices} unless on (node, uuid) {util}'
            f' unless on (node, uuid) {gpm}'
            f' unless on (node, uuid) (max by (node, uuid) (max_over_time({cmem}[{st.r}])) > 0),'
            f' "signal", "process", "", "")',
        ]

    def spinning(self, st: _Steps) -> str:
        """The devices that spin (busy by utilization, no work: with GPM, SM, tensor and
        DRAM activity below the rule's; without, power below its share of the limit);
        value: the utilization. :mod:`..analysis.spinning`'s rule."""
        rule = self.th.spin_rule
        sm = st.active("sm")
        gpm = (f"({sm} < {rule.sm!r}) and on (node, uuid) ({st.active('tensor')} < "
               f"{rule.tensor!r}) and on (node, uuid) ({st.active('dram')} < {rule.dram!r})")
        power = (f"({st.power()} < on (node, uuid) ({rule.power!r} * {st.limit()}))"
                 f" unless on (node, uuid) {sm}")
        return (f"({st.util()} >= {rule.busy!r})"
                f" and on (node, uuid) (({gpm}) or on (node, uuid) ({power}))")

    def silent(self, st: _Steps) -> str:
        """The devices with nothing to judge them by: no utilization sample and no SM
        activity (GPM) in the step."""
        return (f"max by ({GBY}) ({st.sel('gpu_info')}) unless on (node, uuid)"
                f" max_over_time({st.sel('gpu_utilization_ratio')}[{st.r}])"
                f" unless on (node, uuid) {st.active('sm')}")

    def throttling(self, st: _Steps, over: str | None = None) -> str:
        """Each device's throttle seconds per second by reason where above 0 (any reason,
        any amount: a straggler's evidence, not a verdict), over ``over`` (default: the
        step's rate range)."""
        return (f"max by ({GBY}, reason) (rate({st.sel('gpu_throttle_seconds_total')}"
                f"[{over or st.rr}])) > 0")

    def held_parts(self, st: _Steps) -> list[str]:
        """Per container, what it uses of what it holds where that is below the idle
        threshold: the device's SM activity where it has GPM and one holder, else the
        container's utilization times the device's holders (its share of a time-sliced GPU),
        else (a MIG slice without GPM) 0 while it has no process there."""
        r = st.r
        idle = f"{self.th.idle_utilization!r}"
        ns = {"namespace": NOT_EMPTY}
        held = f"max by ({CBY}) (max_over_time({st.sel('container_gpu_allocated', ns)}[{r}]))"
        sole_gpm = (f"(({st.active('sm')}) and on (node, uuid)"
                    f" (count by (node, uuid) ({held}) == 1))")
        cutil_max = (f"max by ({CBY}) (max_over_time("
                     f"{st.sel('container_gpu_utilization_ratio', ns)}[{r}]))")
        cmem = st.sel("container_gpu_memory_used_bytes", ns)
        slices = st.sel("gpu_info", {"parent_uuid": NOT_EMPTY})
        gpm = st.sel("gpu_sm_active_seconds_total")
        return [
            f'label_replace({held} * on (node, uuid) group_left () ({sole_gpm} < {idle}),'
            f' "signal", "sm", "", "")',
            f'label_replace(({cutil_max} * on (node, uuid) group_left ()'
            f' count by (node, uuid) ({held}) < {idle}) and on ({CBY}) {held}'
            f' unless on (node, uuid) {sole_gpm}, "signal", "utilization", "", "")',
            f'label_replace((max by ({CBY}) (max_over_time({cmem}[{r}])) == 0)'
            f' and on ({CBY}) {held} and on (node, uuid) {slices}'
            f' unless on (node, uuid) {gpm} unless on ({CBY}) {cutil_max},'
            f' "signal", "process", "", "")',
        ]

    def candidate_parts(self, st: _Steps) -> list[str]:
        """The workloads (``namespace, workload``, ``kind`` ``stalled`` or ``slow``) that
        may hold a straggler at a step: supersets of the rules of
        :mod:`..analysis.stragglers`, which the analysis applies to the history. A device of
        a workload is the summed utilization of the workload's containers on it. Stalled: a
        device below ``straggler_factor`` x the workload's highest (the median is at most
        that). Slow: every device busy, and the highest SM activity (else power)
        ``slow_factor`` x the lowest or more (the median is at least the lowest)."""
        th = self.th
        per = "by (namespace, workload)"
        devw = st.workload()
        stalled = (f"count {per} ({devw} < on (namespace, workload) group_left ()"
                   f" ({th.straggler_factor!r} * max {per} ({devw})))")
        work = f"({st.active('sm')} or on (node, uuid) {st.power()})"
        xw = f"({devw} * 0 + on (node, uuid) group_left () {work})"
        uw = f"({devw} * 0 + on (node, uuid) group_left () {st.util()})"
        slow = (f"count {per} ({xw}) >= 2 and on (namespace, workload)"
                f" (max {per} ({xw}) >= {th.slow_factor!r} * min {per} ({xw}))"
                f" and on (namespace, workload) (min {per} ({uw}) >= {th.slow_busy!r})")
        return [f'label_replace({stalled}, "kind", "stalled", "", "")',
                f'label_replace({slow}, "kind", "slow", "", "")']

    def candidates(self, st: _Steps) -> str:
        """:meth:`candidate_parts` as one expression."""
        return " or ".join(self.candidate_parts(st))

    # The stragglers' rules themselves, per minute (recorded: :func:`recording_rules`), as
    # :mod:`..analysis.stragglers` applies them to each step: a group is a workload's
    # devices of one GPU model (``model`` from ``gpu_info``, "" where a device has none);
    # a device, the summed utilization of the workload's containers on it (recorded with
    # its model: ``_Steps.workload(model=True)``); the median over
    # the group's devices present in that minute (``quantile(0.5)`` interpolates as
    # ``statistics.median`` does: the mean of the middle two of an even count).

    def stalled_median(self, st: _Steps) -> str:
        """Each group's median utilization, where it has two devices or more."""
        dev = st.workload(model=True)
        return (f"quantile by ({GROUP}) (0.5, {dev})"
                f" and on ({GROUP}) (count by ({GROUP}) ({dev}) >= 2)")

    def stalled(self, st: _Steps) -> str:
        """The devices below ``straggler_factor`` x their group's median (value: the
        device's utilization); reads the recorded median."""
        median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['stalled_median'])}[{st.r}]))"
        return (f"{st.workload(model=True)} < on ({GROUP}) group_left ()"
                f" ({self.th.straggler_factor!r} * {median})")

    def group_work(self, st: _Steps) -> str:
        """Per device of each group, its work: SM activity where every device of the group
        present has it (label ``signal="sm"``), else power (``signal="power"``). Recorded
        (``uuid:gpu_group_work:avg1m``) for the two rules that read it: written out in each,
        it read the devices' workload series some fifteen times a minute (the two: 10.6 s
        of Prometheus' CPU per evaluation at 5,000 nodes; the three since: 4.4 s)."""
        dev = st.workload(model=True)

        def of(expr: str) -> str:
            return f"({dev} * 0 + on (node, uuid) group_left () {expr})"

        sm = of(st.active("sm"))
        gpm = f"(count by ({GROUP}) ({sm}) == on ({GROUP}) count by ({GROUP}) ({dev}))"
        return (f'(label_replace({sm} and on ({GROUP}) {gpm}, "signal", "sm", "", "")'
                f' or label_replace({of(st.power())} unless on ({GROUP}) {gpm},'
                f' "signal", "power", "", ""))')

    def _recorded_work(self, st: _Steps) -> str:
        by = f"{MEMBER}, signal"
        return f"max by ({by}) (avg_over_time({st.sel(RULES['group_work'])}[{st.r}]))"

    def work_median(self, st: _Steps) -> str:
        """Each group's median work (:meth:`group_work`, recorded, label ``signal``) where
        the slow-rank rule can apply: two devices or more, every one busy (utilization >=
        ``slow_busy``) and with its work signal, and the median above 0."""
        dev, work = st.workload(model=True), self._recorded_work(st)
        n = f"count by ({GROUP}) ({dev})"
        busy = (f"count by ({GROUP}) (({dev} * 0 + on (node, uuid) group_left () {st.util()})"
                f" >= {self.th.slow_busy!r})")
        return (f"(quantile by ({GROUP}, signal) (0.5, {work}) > 0)"
                f" and on ({GROUP}) ({n} >= 2)"
                f" and on ({GROUP}) ({busy} == on ({GROUP}) {n})"
                f" and on ({GROUP}) (count by ({GROUP}) ({work}) == on ({GROUP}) {n})")

    def slow(self, st: _Steps) -> str:
        """The devices at ``slow_factor`` x their group's median work or more (value: the
        device's work, label ``signal``); reads the recorded median."""
        median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['work_median'])}[{st.r}]))"
        return (f"{self._recorded_work(st)} >= on ({GROUP}) group_left ()"
                f" ({self.th.slow_factor!r} * {median})")


def recording_rules(thresholds: Thresholds | None = None) -> list[tuple[str, str]]:
    """The ``gpuscope-dashboard`` group, ``(record, expr)`` in evaluation order: the raw
    expressions of :class:`_Steps` and :class:`Verdicts` over one minute (two for rates),
    the sparse verdicts computed from the dense signals recorded before them. The rule file
    holds the same text (a test keeps the two equal)."""
    th = thresholds or _thresholds()
    v = Verdicts(th)
    raw = _Steps(RULE_R, RULE_RR)
    rec = _Steps(RULE_R, RULE_RR, rules=True)
    return [
        (RULES["util_max"], raw.util_max()),
        (RULES["util"], raw.util()),
        (RULES["sm"], raw.active("sm")),
        (RULES["tensor"], raw.active("tensor")),
        (RULES["dram"], raw.active("dram")),
        (RULES["power"], raw.power()),
        (RULES["cutil"], raw.cutil()),
        (RULES["workload"], rec.workload(compute=True)),
        (RULES["idle"], " or ".join(v.idle_parts(rec))),
        (RULES["spin"], v.spinning(rec)),
        (RULES["throttling"], v.throttling(raw)),
        (RULES["silent"], v.silent(raw)),
        (RULES["held_idle"], " or ".join(v.held_parts(rec))),
        (RULES["candidates"], v.candidates(rec)),
        (RULES["stalled_median"], v.stalled_median(rec)),
        (RULES["stalled"], v.stalled(rec)),
        (RULES["group_work"], v.group_work(rec)),
        (RULES["work_median"], v.work_median(rec)),
        (RULES["slow"], v.slow(rec)),
        (RULES["node_gpus"], f"count by (node) ({WHOLE_GPUS})"),
        (RULES["node_models"], "count by (node, model) (max by (node, uuid, model) (gpu_info))"),
        (RULES["node_util_sum"], f"sum by (node) ({_whole_util(rec)})"),
        (RULES["node_util_count"], f"count by (node) ({_whole_util(rec)})"),
        (RULES["cmean"],
         f"avg by ({CBY}) (avg_over_time({CUTIL}[{duration(LEAN_WINDOW)}]))"),
        (RULES["input_range"], f"{_cmean()} > {max(0.0, th.input_low - INPUT_MARGIN)!r}"
                               f" <= {th.input_high + INPUT_MARGIN!r}"),
        (RULES["sharers"], f"count by (node, uuid) ({_cmean()}) >= 2"),
        (RULES["version"],
         f'label_replace(vector({RULES_VERSION}), "thresholds", "{th.key}", "", "")'),
    ]


#: Every container's utilization of a device (the raw gauge).
CUTIL = selector("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})


def _cmean() -> str:
    """The recorded containers' means, as the rules after it read them."""
    return f"max by ({CBY}) (last_over_time({RULES['cmean']}[{RULE_R}]))"


#: Each whole GPU once (a GPU in MIG mode too; not its slices), by node and uuid.
WHOLE_GPUS = 'max by (node, uuid) (gpu_info{parent_uuid=""})'


def _whole_util(st: _Steps) -> str:
    """Each whole GPU's mean utilization in the step, by node and uuid (a NaN left out: the
    page's device means leave it out too)."""
    return f"(max by (node, uuid) ({st.util()}) >= 0) and on (node, uuid) {WHOLE_GPUS}"


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


def index_queries(nodes: Collection[str]) -> list[str]:
    """Each device's index and model (``gpu_info``) on ``nodes``, in ``node=~`` lists:
    Prometheus looks the nodes up in its index, where a join with ``gpu_info`` reads every
    device's series of the fleet (33,400 at 5,000 nodes: most of a drill-down's time from
    Prometheus' head, docs/benchmarks.md)."""
    def build(names: Sequence[str]) -> str:
        info = selector("gpu_info", {"node": f'=~"{any_of(names)}"'})
        return f"max by (node, uuid, gpu, model) ({info})"

    return _split(sorted(set(nodes)), build)


@dataclass(frozen=True, slots=True)
class FollowUp:
    """What the first round singled out for the second: the nodes each history is asked
    about (a node's every device or container comes back; the analysis judges them)."""

    idle: Collection[str] = ()
    idle_nodes: Collection[str] = ()
    shared: Collection[str] = ()
    spinning: Collection[str] = ()
    held: Collection[str] = ()
    candidates: Collection[str] = ()   # stalled or slow-rank candidates' workloads' nodes
    slow: Collection[str] = ()         # slow-rank candidates' workloads' nodes
    input: Collection[str] = ()        # input-starved candidates' pods (names)
    evidence_seconds: float = 0.0
    #: The stragglers' evidence is asked on these nodes (None: on ``candidates``).
    evidence: Collection[str] | None = None


@dataclass
class _FullRuns:
    """The findings (from :meth:`PrometheusData.run_queries`) whose condition held at every
    step of the history, ``(history start, end]``: one summary each, their mean over that
    run. :meth:`results` gives them as the step histories the analysis reads (each of the
    run's steps at the run's mean: the same run, the same means, the same verdicts);
    :meth:`fallback` names the nodes of the rest, whose steps must be asked for."""

    grid: tuple[float, ...]
    idle: dict[GpuRef, str] = field(default_factory=dict)               # signal
    spin: dict[GpuRef, dict[str, float]] = field(default_factory=dict)  # signal -> mean
    held_steps: dict[GpuRef, float] = field(default_factory=dict)       # steps held
    held_idle: dict[ContainerRef, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, rows: Iterable[tuple[dict[str, str], float]], window: Window,
              steps: int) -> _FullRuns:
        """The summaries of ``rows``, over the last ``steps`` steps of ``window``."""
        grid = tuple(window.end - (steps - 1 - i) * window.step for i in range(steps))
        out = cls(grid)
        for lab, v in rows:
            stat, ref = lab.get("stat", ""), _gref(lab)
            if stat == "idle":
                out.idle[ref] = lab.get("signal", "utilization")
            elif stat == "spin":
                out.spin.setdefault(ref, {})[lab.get("signal", "")] = v
            elif stat == "held":
                out.held_steps[ref] = v
            elif stat == "held_idle":
                out.held_idle[_cref(lab)] = (lab.get("signal", "utilization"), v)
        # A spinning device is summarised only with its utilization (its rule's first term).
        out.spin = {ref: m for ref, m in out.spin.items() if "utilization" in m}
        return out

    def fallback(self, idle: Collection[GpuRef], spinning: Collection[GpuRef],
                 held: Collection[ContainerRef]) -> FollowUp:
        """The nodes whose step histories are still needed: of the findings now (the first
        round's) not held over the whole history, and of the idle or spinning devices held
        by a container in only some of its steps (the waste split counts them)."""
        idle_rest = {g for g in idle if g not in self.idle}
        spin_rest = {g for g in spinning if g not in self.spin}
        steps = len(self.grid)
        partly_held = {g for g in [*idle, *spinning]
                       if g in self.held_steps and round(self.held_steps[g]) != steps}
        return FollowUp(
            idle={g.node for g in idle_rest},
            idle_nodes={g.node for g in idle_rest | spin_rest | partly_held},
            spinning={g.node for g in spin_rest},
            held={c.node for c in held if c not in self.held_idle},
        )

    def results(self) -> dict[str, list[tuple[dict[str, str], Series]]]:
        """The summaries as the second round's step histories, by role."""
        n = len(self.grid)

        def const(value: float) -> Series:
            return Series(self.grid, (value,) * n)

        def dev(ref: GpuRef, **more: str) -> dict[str, str]:
            return {"node": ref.node, "uuid": ref.uuid, **more}

        names = {"utilization": "utilization", "sm": "sm", "tensor": "tensor", "dram": "dram",
                 "power": "power"}
        spinning: list[tuple[dict[str, str], Series]] = []
        for ref, means in self.spin.items():
            spinning += [(dev(ref, signal=names[k]), const(v)) for k, v in means.items()
                         if k in names]
            if "limit" in means:
                spinning.append((dev(ref, signal="limit"),
                                 Series(self.grid[-1:], (means["limit"],))))
        steps = len(self.grid)
        return {
            "idle_steps": [(dev(ref, signal=sig), const(0.0)) for ref, sig in self.idle.items()],
            "allocated": [(dev(ref), const(1.0)) for ref, c in self.held_steps.items()
                          if round(c) == steps],
            "spinning": spinning,
            "held_idle": [({"node": c.node, "namespace": c.namespace, "pod": c.pod,
                            "container": c.container, "uuid": c.uuid, "signal": sig},
                           const(v)) for c, (sig, v) in self.held_idle.items()],
        }




def _group_key(lab: Mapping[str, str]) -> GroupKey:
    return lab.get("namespace", ""), lab.get("workload", ""), lab.get("model", "")


@dataclass
class _StragglerRuns:
    """The stragglers (from :meth:`PrometheusData.run_queries`) whose rule held at every step
    of the history: each device's mean over that run (``runs``: kind, signal, mean) and its
    group's median's mean over the same steps (``medians``, by group and kind: signal,
    mean). :meth:`split` says which groups flagged at the end they describe whole;
    :meth:`synthesize` gives those groups as the step histories the analysis reads."""

    grid: tuple[float, ...]
    runs: dict[GroupKey, dict[GpuRef, tuple[str, str, float]]] = field(default_factory=dict)
    medians: dict[tuple[GroupKey, str], tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, rows: Iterable[tuple[dict[str, str], float]],
              grid: tuple[float, ...]) -> _StragglerRuns:
        out = cls(grid)
        for lab, v in rows:
            stat, key = lab.get("stat", ""), _group_key(lab)
            if stat in ("stalled", "slow"):
                out.runs.setdefault(key, {})[_gref(lab)] = (
                    stat, lab.get("signal", "utilization"), v)
            elif stat in ("stalled_median", "slow_median"):
                out.medians[(key, stat.partition("_")[0])] = (
                    lab.get("signal", "utilization"), v)
        return out

    def split(self, flagged: Mapping[GroupKey, Mapping[GpuRef, str]],
              groups: Mapping[GroupKey, Mapping[GpuRef, Sequence[ContainerRef]]],
              apart: Collection[GpuRef]) -> tuple[set[GroupKey], set[GroupKey]]:
        """Of the groups with a device ``flagged`` at the end (by kind), those described
        whole (every flagged device's run held over the whole history, one kind, the
        median's mean there, every device of the group, from ``groups``, used by one
        container and none of them ``apart``: a time-sliced or spinning device has step
        histories of its own) and the others, whose steps must be asked for."""
        whole: set[GroupKey] = set()
        rest: set[GroupKey] = set()
        for key, flags in flagged.items():
            runs, members = self.runs.get(key, {}), groups.get(key, {})
            kinds = set(flags.values())
            kind = next(iter(kinds))
            ok = (len(kinds) == 1 and (key, kind) in self.medians
                  and set(runs) == set(flags)
                  and all(runs[g][:2] == (kind, self.medians[(key, kind)][0]) for g in runs)
                  and all(g in members for g in flags)
                  and 2 * len(flags) <= len(members)
                  and all(len(cs) == 1 and g not in apart for g, cs in members.items()))
            (whole if ok else rest).add(key)
        return whole, rest

    def synthesize(self, keys: Iterable[GroupKey],
                   groups: Mapping[GroupKey, Mapping[GpuRef, Sequence[ContainerRef]]],
                   busy: float) -> tuple[dict[ContainerRef, Series],
                                         dict[str, dict[GpuRef, Series]]]:
        """The groups ``keys`` (from :meth:`split`) as step histories on the run's steps,
        giving the analysis the same runs, means and medians: the stragglers at their
        means, as many of the group's other devices as there are stragglers plus one at the
        median's mean (so that the median of each step is that mean; where the group has
        only as many others as stragglers, the others at the value that puts the median
        there), the rest of the group with no steps. Stalled: the devices' containers'
        utilization. Slow: the containers at a common value (none is stalled), every device
        busy, and the work signal (``sm``: every device of the group has it). Returns the
        containers' histories and the signals (``utilization``, ``sm``, ``power``) of every
        device of these groups, which replace whatever else was asked about them."""
        n = len(self.grid)

        def const(value: float) -> Series:
            return Series(self.grid, (value,) * n)

        containers: dict[ContainerRef, Series] = {}
        signals: dict[str, dict[GpuRef, Series]] = {"utilization": {}, "sm": {}, "power": {}}
        for key in keys:
            members = groups[key]
            runs = self.runs[key]
            kind = next(iter(runs.values()))[0]
            signal, median = self.medians[(key, kind)]
            mine = {g: v for g, (_, _, v) in runs.items()}
            others = [g for g in sorted(members) if g not in mine]
            k = len(mine)
            if len(others) > k:
                others, other = others[:k + 1], median
            else:  # as many others as stragglers: the middle two's mean is the median
                edge = max(mine.values()) if kind == "stalled" else min(mine.values())
                other = 2 * median - edge
            values = {**mine, **dict.fromkeys(others, other)}
            for g, cs in members.items():
                for c in cs:
                    if g not in values:
                        containers[c] = _NO_POINTS
                    else:
                        containers[c] = const(values[g] if kind == "stalled" else 1.0)
            if kind == "slow":
                for g in members:
                    if g in values:
                        signals["utilization"][g] = const(max(1.0, busy))
                        signals[signal][g] = const(values[g])
                    elif signal == "sm":  # every device of the group has GPM
                        signals["sm"][g] = _NO_POINTS
        return containers, signals


def _group_of(ref: ContainerRef, pods: Mapping[PodKey, PodInfo], gpus: Mapping[GpuRef, GpuInfo],
              node_models: Mapping[str, str] | None) -> GroupKey | None:
    from gpuscope.dashboard.verdicts.stragglers import group_of
    return group_of(ref, pods, gpus, node_models)


def _groups(members: Iterable[ContainerRef], pods: Mapping[PodKey, PodInfo],
            gpus: Mapping[GpuRef, GpuInfo], node_models: Mapping[str, str] | None = None,
            ) -> dict[GroupKey, dict[GpuRef, list[ContainerRef]]]:
    """The straggler groups of the containers ``members`` (:func:`group_of`, as
    :func:`..analysis.stragglers.workload_groups` forms them): per group, its devices and
    the group's containers on each."""
    out: dict[GroupKey, dict[GpuRef, list[ContainerRef]]] = {}
    # 10^5 containers on a large fleet: each dict and list made only when missing
    # (``setdefault`` would make one for every container).
    for c in members:
        key = _group_of(c, pods, gpus, node_models)
        if key is None:
            continue
        gpu = c.gpu
        devices = out.get(key)
        if devices is None:
            devices = out[key] = {}
        on = devices.get(gpu)
        if on is None:
            devices[gpu] = [c]
        else:
            on.append(c)
    return out


def _summaries(rows: Iterable[tuple[dict[str, str], float]]) -> dict[str, NodeSummary]:
    """The nodes' numbers (``node_summary`` of :meth:`PrometheusData.fleet_queries`)."""
    parts: dict[str, dict[str, float]] = {}
    models: dict[str, set[str]] = {}
    for lab, value in rows:
        node, stat = lab.get("node", ""), lab.get("stat", "")
        if stat == "model":
            models.setdefault(node, set()).add(lab.get("model", ""))
        else:
            parts.setdefault(node, {})[stat] = value
    out = {}
    for node, p in parts.items():
        if "gpus" not in p:
            continue  # no inventory: not a GPU node (now)
        found = models.get(node, set())
        out[node] = NodeSummary(
            gpus=int(p["gpus"]), mean=p.get("mean"), known=int(p.get("known", 0)),
            model=next(iter(found)) if len(found) == 1 else "")
    return out


def detail_nodes(named: Collection[str], summaries: Mapping[str, NodeSummary],
                 share: float = 0.5) -> set[str] | None:
    """The nodes whose devices the fleet page reads with the rules: those ``named`` (a
    verdict, a time-sliced device or an input-starved candidate there, a straggler group's),
    those whose devices have several models (MIG), and the :data:`MAX_HEATMAP_NODES` least
    busy, which the heatmap may draw (its order, by the summaries' means, is
    :func:`..views.build_fleet_view`'s). None (every node) where that is more than ``share``
    of the fleet: one query without a list then reads about as much, and sends no list."""
    lowest = sorted(summaries, key=lambda n: (summary_mean(summaries[n]), n))
    nodes = (set(named) | set(lowest[:MAX_HEATMAP_NODES])
             | {n for n, s in summaries.items() if not s.model})
    return None if len(nodes) > share * len(summaries) else nodes


class _Answers:
    """The answers of a round of queries (:meth:`PrometheusData._submit`), by role (the
    parts of a role split over several queries put together), each waited for when first
    read: the page reads the first answers (the inventory) while the store still computes
    the others, instead of waiting for the slowest (with the run summaries sent first in
    the second round, the 5,000-node page's queries went from about 4.6 s to 4.0 s)."""

    def __init__(self, pending: Mapping[str, list[Future[Any]]]) -> None:
        self._pending = dict(pending)
        self._done: dict[str, list[Any]] = {}

    def __getitem__(self, role: str) -> list[Any]:
        if role not in self._done:
            rows: list[Any] = []
            for fut in self._pending.pop(role, ()):
                rows.extend(fut.result())  # DataError
            self._done[role] = rows
        return self._done[role]

    def add(self, more: _Answers) -> None:
        """The roles of another round sent meanwhile (read as these are)."""
        self._pending.update(more._pending)

    def all(self) -> dict[str, list[Any]]:
        """Every role's answer (each waited for)."""
        for role in list(self._pending):
            self[role]
        return dict(self._done)


#: The most nodes the page reads from the raw series (without the recording rules) in
#: about a second: docs/benchmarks.md (500 nodes: 0.7 s; 5,000: several seconds). Beyond
#: it the page says how to load the rules.
RAW_NODES = 1000
RAW_NOTE = ("This fleet has {nodes:,} nodes: without the gpuscope-dashboard recording rules the "
            "page reads every device's raw series, which grows slow beyond {most:,} nodes. Load "
            "the rules made for this page's thresholds into your Prometheus or vmalert "
            "(gpuscope-dashboard --print-rules prints them; docs/dashboard.md, \"Recording "
            "rules\").")


def rules_yaml(thresholds: Thresholds | None = None) -> str:
    """The ``gpuscope-dashboard`` group as it stands in alerts/gpuscope-rules.yaml (each
    expression folded to 88 columns): ``python -c "from gpuscope.dashboard.data.prometheus
    import rules_yaml; print(rules_yaml())"`` prints it."""
    out = ["  - name: gpuscope-dashboard", "    interval: 1m", "    rules:"]
    for record, expr in recording_rules(thresholds):
        out += [f"      - record: {record}", "        expr: >-",
                textwrap.indent(textwrap.fill(expr, 88, break_long_words=False,
                                              break_on_hyphens=False), " " * 10)]
    return "\n".join(out) + "\n"


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
        self.thresholds = thresholds or _thresholds()
        self.idle_threshold = self.thresholds.idle_utilization
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promql")
        self.queries_total = 0
        self._lock = threading.Lock()
        # Whether the recording rules serve a window (by its length): (when checked, loaded).
        self._rules_seen: dict[int, tuple[float, bool]] = {}
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

    # -- HTTP ------------------------------------------------------------------------------
    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        """The answer's ``data``; DataError (one line) otherwise: :meth:`PromApi.post_form`."""
        with self._lock:
            self.queries_total += 1
        decode = _DECODE_RANGE if path.endswith("query_range") else _DECODE_INSTANT
        return self._client.post_form(path, params, decode=decode)

    def instant(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        # ``nocache=1``: VictoriaMetrics moves an instant query at a time less than
        # ``-search.latencyOffset`` (30 s) before its now back to now - 30 s unless told not
        # to (Prometheus evaluates at ``time``, and ignores the parameter): the window's end
        # must be the same instant on both.
        data = self._api("/api/v1/query", {"query": promql, "time": f"{at:.3f}",
                                           "nocache": "1"})
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
            # Columns first, each converted in one C-level pass (a fleet page can bring
            # back millions of points).
            times, values = zip(*r["values"], strict=True) if r["values"] else ((), ())
            if values and not isinstance(values[0], float):  # json.loads: strings
                times, values = tuple(map(float, times)), tuple(map(float, values))
            out.append((_labels(r["metric"]), Series(times, values)))
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

    @staticmethod
    def _minutes(window: Window) -> bool:
        """Whether ``window``'s steps are the recording rules' minutes."""
        return round(window.step * 1000) == round(RULE_INTERVAL * 1000)

    def _steps(self, window: Window, rules: bool, match: Mapping[str, str] | None = None
               ) -> _Steps:
        return _Steps(*self._r(window), rules=rules, match=match)

    def fleet_queries(self, window: Window, namespace: str | None,
                      rules: bool = False) -> dict[str, str]:
        """The fleet page's first round of PromQL, by role: instant queries at the window's
        end. Every verdict needs its condition at the latest step (a trailing run), so the
        server applies each rule to that step over the whole fleet (one step) and sends back
        only what meets it (``now``: idle, spinning, throttled devices, allocated-idle
        containers, straggler candidates' workloads and, on one-minute steps with the
        rules, the stragglers' devices, devices with nothing to judge them by), beside who
        is where (devices, nodes, pods, containers in the window, each container with its
        raw mean: the input-starved candidates) and each device's window mean.
        :meth:`second_round` then asks the history of what was singled out, by node. No
        query here names a device or a node. With ``rules``, ``now`` reads what the
        ``gpuscope-dashboard`` recording rules recorded in the last step."""
        r, rr = self._r(window)
        w = duration(window.seconds)
        s = duration(window.step)
        # The window's steps, its start included, over a range half a step longer:
        # Prometheus 2 takes a subquery's or a range's start, VictoriaMetrics does not.
        whole = duration(window.seconds + window.step / 2)
        st = _Steps(r, rr, rules)
        v = Verdicts(self.thresholds)

        # Who uses what and which devices there are, of every node: the queries
        # :meth:`detail_queries` asks of some nodes with the rules.
        every = self.detail_queries(window, None, members=True)
        pods = "gpu_pod_info"
        members = every["members"]
        if namespace is not None:
            # Who uses what: the namespace's devices and every container on them (asked by
            # :meth:`members_queries` on the nodes this finds: not every container's series).
            mine = selector("container_gpu_utilization_ratio", namespace=namespace)
            members = f"count by (node) (last_over_time({mine}[{w}]))"
            pods = selector("gpu_pod_info", namespace=namespace)
        def recorded(key: str, by: str) -> str:
            return f"max by ({by}) (last_over_time({RULES[key]}[{r}]))"

        if rules:
            now = [
                _stat(recorded("idle", f"{GBY}, signal"), "idle"),
                _stat(recorded("spin", GBY), "spin"),
                _stat(recorded("held_idle", f"{CBY}, signal"), "held_idle"),
                _stat(recorded("candidates", "namespace, workload, kind"), "candidate"),
            ]
            if self._minutes(window):
                # On one-minute steps, the stragglers' own rules at the end: which groups
                # can hold one, and which of their devices.
                # Whether those rules are loaded at all (a rule file older than the page's
                # records none; then the candidates' steps are asked for, as without the
                # summaries): the group medians, recorded wherever a workload has two
                # devices of a model.
                now[3] = " or ".join([
                    now[3], _stat(recorded("stalled", MEMBER), "stalled"),
                    _stat(recorded("slow", f"{MEMBER}, signal"), "slow"),
                    _stat(f"count(last_over_time({RULES['stalled_median']}[{r}]))",
                         "straggler_rules")])
        else:
            now = [
                _stat(" or ".join(v.idle_parts(st)), "idle"),
                _stat(v.spinning(st), "spin"),
                " or ".join(_stat(p, "held_idle") for p in v.held_parts(st)),
                *(_stat(p, "candidate") for p in v.candidate_parts(st)),
            ]
        out = {
            "nodes": " or ".join([
                "max by (node, instance_type, zone, capacity_type) (gpu_node_info)",
                # When data begins: the first step at which any device reported. Where one
                # did a rate range before the window's first step (as it usually has: the
                # store is older than the window), the window's start, read at that time
                # alone (the rates of the window's first steps then cover their whole range);
                # else :meth:`first_query` (a query more, on a young store).
                # Asked of each node's GPU 0 only (a node's first device: a fifth to an
                # eighth of the series, 0.2 s of the store's time less at 5,000 nodes);
                # where none of them reported then, :meth:`first_query` asks of every device.
                _stat(f"count({selector('gpu_utilization_ratio', gpu='0')}"
                     f" @ {self._full_history_at(window):.3f})", "at_start"),
            ]),
            # Who uses which device in the window (a history only where asked for later).
            # Each one's raw mean over the window: the input-starved candidates are those
            # in the suspicious range (the rule's own test of the same mean: nothing is
            # lost); one pass over the containers' samples for both.
            # (With a namespace, the nodes where it ran: ``ns_nodes``.)
            "members" if namespace is None else "ns_nodes": members,
            "pods": f"max by (node, namespace, pod, workload) (last_over_time({pods}[{w}]))",
            # Which devices there are (after who uses what, which the second round needs:
            # with the summaries it is sent before this is read).
            "gpus": every["gpus"],
        }
        if self.lean(window, namespace, rules):
            del out["members"]  # (:meth:`summary_queries`, then :meth:`detail_queries`)
        if rules:
            del out["gpus"]
        now[2] = " or ".join([
            now[2],
            # The devices with nothing to judge them by (no utilization, no GPM): with the
            # rules, recorded (every device's raw series read each minute by the rule, not
            # by the page: 0.35 s of the store's time at 5,000 nodes).
            _stat(recorded("silent", GBY) if rules else v.silent(st), "silent"),
        ])
        # One query per rule (``now``, ``now#1``...): they run side by side, and none comes
        # near a store's limit on one query's time (VictoriaMetrics: 30 s by default).
        # What holds at the end first (small answers the run summaries wait for), then who
        # is where.
        out = {"nodes": out.pop("nodes"),
               **{"now" if i == 0 else f"now#{i}": q for i, q in enumerate(now)}, **out}
        # Each device's mean, labelled with node and uuid alone (33 k rows at 5,000 nodes:
        # with its index and a ``stat`` label, a fifth more to send and read). Sent last and
        # read last: only the heatmap and the KPIs need it, not the second round, which
        # starts while the store still computes it. (With the rules: the nodes' numbers
        # instead, and the devices' means of the nodes :meth:`detail_queries` names.)
        if not rules:
            # The window mean of each step's utilization (the busy counter's rate, else the
            # gauge's mean): steps before a device appeared, or at which its counter is
            # younger than the rate's range, do not count.
            out["gpu_stats"] = (f"max by (node, uuid) (avg_over_time(({_util_step(rr)})"
                                f"[{whole}:{s}]))")
        return out

    def summary_queries(self, window: Window, namespace: str | None) -> dict[str, str]:
        """With the recording rules, where what holds at the end names less than
        :attr:`detail_share` of the nodes: each node's numbers (``node_summary``, the rows
        of :class:`NodeSummary`), and, over the default window (:meth:`lean`), who uses
        what: the devices two containers or more used, the containers near the
        input-starved range, and how many straggler groups there are (a group's median is
        recorded each minute it has two devices or more). :meth:`detail_queries` then
        asks the devices and containers of the nodes these name."""
        r, _ = self._r(window)
        w = duration(window.seconds)
        whole = duration(window.seconds + window.step / 2)

        out = {"node_summary": " or ".join([
            _stat(f"max by (node) (last_over_time({RULES['node_gpus']}[{r}]))", "gpus"),
            _stat(f"max by (node, model) (last_over_time({RULES['node_models']}[{r}]))",
                 "model"),
            # The mean over the window's GPU-minutes.
            _stat(f"sum by (node) (sum_over_time({RULES['node_util_sum']}[{whole}]))"
                 f" / sum by (node) (sum_over_time({RULES['node_util_count']}[{whole}]))",
                 "mean"),
            _stat(f"max by (node) (max_over_time({RULES['node_util_count']}[{whole}]))",
                 "known"),
        ])}
        if self.lean(window, namespace, True):
            out["sharers"] = f"max by (node, uuid) (last_over_time({RULES['sharers']}[{r}]))"
            out["input_range"] = (f"max by ({CBY}) (last_over_time({RULES['input_range']}"
                                  f"[{r}]))")
            out["groups"] = (f"count(count by ({GROUP}) (last_over_time("
                             f"{RULES['stalled_median']}[{w}])))")
        return out

    def lean(self, window: Window, namespace: str | None, rules: bool) -> bool:
        """Whether the fleet page reads who uses what from the rules (the whole fleet over
        :data:`LEAN_WINDOW`: the window the rules describe containers over): then it reads
        the containers' series of the nodes that need them only. A namespace's page reads
        the namespace's nodes' (:meth:`members_queries`)."""
        return rules and namespace is None and round(window.seconds) == round(LEAN_WINDOW)

    def detail_queries(self, window: Window, nodes: Collection[str] | None,
                       members: bool = False) -> dict[str, str]:
        """With the recording rules, the devices of ``nodes`` (every node where None):
        each one's index, model and parent (``gpus``), and its window mean (``gpu_stats``),
        and (``members``) each container's raw mean on them (``members``, as
        :meth:`fleet_queries` asks it of the whole fleet), in ``node=~`` lists (split as
        :func:`_split` does: ``gpus#1``...)."""
        whole = duration(window.seconds + window.step / 2)
        w = duration(window.seconds)

        def build(names: Sequence[str] | None) -> dict[str, str]:
            on = {} if names is None else {"node": f'=~"{any_of(names)}"'}
            info = selector("gpu_info", on)
            util = selector(RULES["util"], on)
            cutil = selector("container_gpu_utilization_ratio", {**on, "namespace": NOT_EMPTY})
            return {"gpus": f"max by (node, gpu, uuid, model, parent_uuid, mig_profile) ({info})",
                    "gpu_stats": f"max by (node, uuid) (avg_over_time({util}[{whole}]))",
                    "members": f"avg by ({CBY}) (avg_over_time({cutil}[{w}]))"}

        roles = ("members", "gpus", "gpu_stats") if members else ("gpus", "gpu_stats")
        if nodes is None:
            every = build(None)
            return {role: every[role] for role in roles}
        names = sorted(set(nodes))
        out: dict[str, str] = {}
        for role in roles:
            def of(part: Sequence[str], role: str = role) -> str:
                return build(part)[role]

            for n, q in enumerate(_split(names, of)):
                out[role if n == 0 else f"{role}#{n}"] = q
        return out

    def members_queries(self, window: Window, namespace: str, nodes: Collection[str]
                        ) -> dict[str, str]:
        """Who uses what where the page is filtered to ``namespace``: each container's raw
        mean over the window (as ``members`` of :meth:`fleet_queries`) on the devices the
        namespace used, every container on them (time-slicing shares need the other
        sharers too), asked on ``nodes`` (where it ran: the first round's ``ns_nodes``) in
        ``node=~`` lists: the fleet's other 29,000 containers' series are not read (0.46 s
        of the store's time at 5,000 nodes)."""
        w = duration(window.seconds)

        def build(names: Sequence[str]) -> str:
            on = {"node": f'=~"{any_of(names)}"'}
            cutil = selector("container_gpu_utilization_ratio", {**on, "namespace": NOT_EMPTY})
            mine = selector("container_gpu_utilization_ratio", on, namespace=namespace)
            return (f"avg by ({CBY}) (avg_over_time({cutil}[{w}]))"
                    f" and on (node, uuid) max by (node, uuid) (last_over_time({mine}[{w}]))")

        return {"members" if i == 0 else f"members#{i}": q
                for i, q in enumerate(_split(sorted(set(nodes)), build))}

    @staticmethod
    def first_query(window: Window) -> str:
        """When data begins in ``window``: the first step at which any device reported."""
        whole = duration(window.seconds + window.step / 2)
        return (f"min_over_time(timestamp(count(gpu_utilization_ratio))"
                f"[{whole}:{duration(window.step)}])")

    RANGE_QUERIES = frozenset({"containers", "idle_steps", "allocated", "shared", "spinning",
                               "held_idle", "workload_signals"})
    INSTANT_QUERIES = frozenset({"gpus", "nodes", "gpu_stats", "members", "ns_nodes", "pods",
                                 "now", "stats", "evidence", "runs", "node_summary",
                                 "sharers", "input_range", "groups"})

    def second_round(self, window: Window, ask: FollowUp, namespace: str | None = None,
                     rules: bool = False, by_node: bool = False) -> dict[str, str]:
        """The history of what the first round singled out, asked by node (``node=~``
        lists; a query is at most :data:`MAX_QUERY_BYTES`, a longer list is split over
        queries named ``role#1``, ``role#2``...): per step, the idle steps of the devices
        there, allocation on the nodes idle now (the waste split), utilization of the
        devices and containers of nodes with time-sliced devices or straggler candidates,
        the work signals of spinning GPUs and of slow-rank candidates' workloads,
        throttling, the held devices' use; and, at the end, the input-starved candidates'
        raw-sample statistics (stddev, count, memory; the mean is the first round's; asked by
        pod, ``pod=~``, for the candidates alone) and the stragglers' evidence over
        ``ask.evidence_seconds``.
        With ``rules``, the idle and held-idle steps are the recorded sparse
        series themselves, asked without a list (they hold only what meets the rule), or
        (``by_node``: the few findings :meth:`run_queries` could not summarise) by node."""
        r, rr = self._r(window)
        w = duration(window.seconds)
        v = Verdicts(self.thresholds)
        out: dict[str, str] = {}

        def each(role: str, nodes: Collection[str], build: Callable[[_Steps], str],
                 label: str = "node") -> None:
            for i, q in enumerate(_split(sorted(set(nodes)), lambda names: build(
                    _Steps(r, rr, rules, {label: f'=~"{any_of(names)}"'})))):
                out[role if i == 0 else f"{role}#{i}"] = q

        def signal(expr: str, name: str) -> str:
            return labelled(expr, "signal", name)

        if rules:
            # Every minute of the step met the rule (a step of several minutes).
            minutes = max(1, round(window.step / RULE_INTERVAL))

            def sparse(st: _Steps, key: str, by: str, fn: str) -> str:
                rec = st.sel(RULES[key])
                return (f"max by ({by}) ({fn}({rec}[{r}])) and on ({by})"
                        f" (count_over_time({rec}[{r}]) >= {minutes})")

            for role, key, nodes, by, fn in (
                    ("idle_steps", "idle", ask.idle, f"{GBY}, signal", "max_over_time"),
                    ("held_idle", "held_idle", ask.held, f"{CBY}, signal", "avg_over_time")):
                if not nodes:
                    continue
                if by_node:
                    each(role, nodes, partial(sparse, key=key, by=by, fn=fn))
                else:
                    out[role] = sparse(_Steps(r, rr, rules), key, by, fn)
        else:
            each("idle_steps", ask.idle, lambda st: " or ".join(v.idle_parts(st)))
            each("held_idle", ask.held, lambda st: " or ".join(v.held_parts(st)))
        each("allocated", ask.idle_nodes, lambda st: (
            f"max by (node, uuid) (max_over_time("
            f"{st.sel('container_gpu_allocated', {'namespace': NOT_EMPTY})}[{r}]))"))
        each("shared", ask.shared, lambda st: (
            f"max by ({GBY}) (avg_over_time({st.sel('gpu_utilization_ratio')}[{r}]))"))

        def containers(st: _Steps) -> str:
            if namespace is None:
                return st.cutil()
            mine = selector("container_gpu_utilization_ratio", st.match, namespace=namespace)
            return (f"{st.cutil()} and on (node, uuid)"
                    f" max by (node, uuid) (max_over_time({mine}[{r}]))")

        each("containers", set(ask.shared) | set(ask.candidates), containers)
        at = f"{window.end:.3f}"

        def spinning(st: _Steps) -> str:
            # With the rules, only the devices spinning at the end (of the nodes listed,
            # read once: ``@``); without, every device of those nodes (the rule written out
            # in each signal's filter would make the query too long for VictoriaMetrics).
            # Power and its limit only where there is no GPM (the rule's fallback).
            now = (f" and on (node, uuid) last_over_time({st.sel(RULES['spin'])}[{r}] @ {at})"
                   if rules else "")
            gpm = st.sel("gpu_sm_active_seconds_total")
            return " or ".join(
                f"{signal(expr, name)}{now}" for name, expr in (
                    ("utilization", st.util()), ("sm", st.active("sm")),
                    ("tensor", st.active("tensor")), ("dram", st.active("dram")),
                    ("power", f"{st.power()} unless on (node, uuid) {gpm}"),
                    ("limit", f"{st.limit()} unless on (node, uuid) {gpm}")))

        def workload_signals(st: _Steps) -> str:
            gpm = st.sel("gpu_sm_active_seconds_total")
            return " or ".join(signal(expr, name) for name, expr in (
                ("utilization", st.util()), ("sm", st.active("sm")),
                ("power", f"{st.power()} unless on (node, uuid) {gpm}"),
                ("limit", f"{st.limit()} unless on (node, uuid) {gpm}")))

        each("spinning", ask.spinning, spinning)
        each("workload_signals", ask.slow, workload_signals)

        def stats(st: _Steps) -> str:
            ns = {"namespace": NOT_EMPTY} if namespace is None else {}
            eq = {} if namespace is None else {"namespace": namespace}
            util = selector("container_gpu_utilization_ratio", {**st.match, **ns}, **eq)
            mem = selector("container_gpu_memory_used_bytes", {**st.match, **ns}, **eq)
            return " or ".join(
                # (the mean: the first round's ``members``)
                labelled(expr, "stat", name) for name, expr in (
                    ("stddev", f"avg by ({CBY}) (stddev_over_time({util}[{w}]))"),
                    ("count", f"max by ({CBY}) (count_over_time({util}[{w}]))"),
                    ("memory", f"max by ({CBY}) (max_over_time({mem}[{w}]))")))

        # By pod name, not node: the candidates' own series only (1,400 of the 29,000
        # containers at 5,000 nodes, on 1,100 nodes holding 12,000 others; the few other
        # containers of their pods, not candidates, are left out by the analysis' own test
        # of the mean): 0.21-0.26 s of the store's time instead of 0.52-0.61 s.
        each("stats", ask.input, stats, "pod")
        if ask.evidence_seconds > 0:
            d = duration(ask.evidence_seconds)
            evidence = ask.candidates if ask.evidence is None else ask.evidence
            # Throttling over the last ``d``: the counters' rate, or with the rules the mean
            # of the recorded minutes where it was above 0 (absent minutes count 0; each
            # minute's value is the rate over two): 11 reasons' counters per device are 90 %
            # of the evidence's cost in the store (0.8 s at 5,000 nodes), the sparse series
            # almost nothing.
            minutes = max(1, round(ask.evidence_seconds / RULE_INTERVAL))
            dm = duration(minutes * RULE_INTERVAL - EDGE)

            def throttling(st: _Steps) -> str:
                if st.rules:
                    return (f"max by ({GBY}, reason) (sum_over_time("
                            f"{st.sel(RULES['throttling'])}[{dm}])) / {minutes}")
                return v.throttling(st, d)

            each("evidence", evidence, lambda st: " or ".join([
                f'label_replace({throttling(st)}, "stat", "throttle", "", "")',
                f'label_replace(max by ({GBY}) (avg_over_time('
                f'{st.sel("gpu_sm_clock_hertz")}[{d}])), "stat", "sm_clock", "", "")',
                f'label_replace(max by ({GBY}) (avg_over_time('
                f'{st.sel("gpu_temperature_celsius")}[{d}])), "stat", "temperature", "", "")',
            ]))
        return out

    def run_queries(self, window: Window, history_start: float,
                    devices: Collection[str] = (), spinning: Collection[str] = (),
                    held: bool = True, stragglers: bool = False,
                    namespace: str | None = None) -> dict[str, str]:
        """With the recording rules: each finding whose sparse series has a sample at every
        step of the history (``(history_start, end]``, one-minute steps: one sample a
        step), summarised in one number, instead of its steps (a whole fleet's idle and
        spinning devices would be hundreds of thousands of points): idle devices (their
        signal), spinning devices (their utilization's mean, and on ``spinning`` nodes their
        other signals' means, power and its limit where they have no GPM), how many of
        those steps a container held each idle or spinning device on ``devices`` nodes
        (all of them, or the steps are asked for: a scrape every minute gives one sample a
        step, so ``n`` samples are the ``n`` steps; a faster scrape gives more, and the
        steps are asked for), allocated-idle containers and
        throttled devices (their means), and (``stragglers``; of ``namespace`` where given)
        the stalled and slow devices with their means, and their groups' medians' means
        over the same steps. Raw range functions over the recorded series (no subquery);
        the dense series only on the nodes listed (split as :func:`_split`)."""
        h = duration(window.end - history_start - EDGE)
        n = round((window.end - history_start) / window.step)
        r, _ = self._r(window)
        out: dict[str, str] = {}

        def stat(expr: str, name: str, signal: str = "") -> str:
            if signal:  # a spinning run's mean, by signal
                expr = labelled(expr, "signal", signal)
            return labelled(expr, "stat", name)

        def full(key: str, by: str, match: Mapping[str, str] | None = None) -> str:
            rec = selector(RULES[key], match)
            return f"(max by ({by}) (count_over_time({rec}[{h}])) == {n})"

        def each(nodes: Collection[str], build: Callable[[Mapping[str, str]], str]) -> None:
            for q in _split(sorted(set(nodes)),
                            lambda names: build({"node": f'=~"{any_of(names)}"'})):
                out[f"runs#{len(out)}"] = q

        def spin(match: Mapping[str, str]) -> str:
            def sel(key: str) -> str:
                return selector(RULES[key], match)

            mine = full("spin", GBY, match)
            no_gpm = f"unless on (node, uuid) count_over_time({sel('sm')}[{h}])"
            limit = selector("gpu_power_limit_watts", match)
            return " or ".join([
                *(stat(f"max by ({GBY}) (avg_over_time({sel(key)}[{h}]))"
                       f" and on (node, uuid) {mine}", "spin", key)
                  for key in ("sm", "tensor", "dram")),
                stat(f"max by ({GBY}) (avg_over_time({sel('power')}[{h}]))"
                     f" and on (node, uuid) {mine} {no_gpm}", "spin", "power"),
                stat(f"max by ({GBY}) (max_over_time({limit}[{r}]))"
                     f" and on (node, uuid) {mine} {no_gpm}", "spin", "limit"),
            ])

        def alloc(match: Mapping[str, str]) -> str:
            held = selector("container_gpu_allocated", {**match, "namespace": NOT_EMPTY})
            return stat(
                f"max by (node, uuid) (count_over_time({held}[{h}])) and on (node, uuid)"
                f" (last_over_time({selector(RULES['idle'], match)}[{r}])"
                f" or last_over_time({selector(RULES['spin'], match)}[{r}]))", "held")

        # The sparse series alone: cheap over the whole fleet.
        parts = [stat(full("idle", f"{GBY}, signal"), "idle"),
                 # A spinning run's mean utilization is the recorded series' own value.
                 stat(f"max by ({GBY}) (avg_over_time({RULES['spin']}[{h}]))"
                      f" and on (node, uuid) {full('spin', GBY)}", "spin", "utilization")]
        if held:
            mean = f"max by ({CBY}, signal) (avg_over_time({RULES['held_idle']}[{h}]))"
            parts.append(stat(f"{mean} and on ({CBY}, signal)"
                              f" {full('held_idle', f'{CBY}, signal')}", "held_idle"))
        out["runs"] = " or ".join(parts)
        if stragglers:
            # A straggler held at every step, with its mean, and its group's median's mean
            # over the same steps (the median is there at each of them: the rule compares
            # with it).
            ns = ({} if namespace is None
                  else {"namespace": f'="{escape_label_value(namespace)}"'})
            found = []
            for kind, median, by in (("stalled", "stalled_median", MEMBER),
                                     ("slow", "work_median", f"{MEMBER}, signal")):
                runs = full(kind, by, ns)
                found += [
                    stat(f"max by ({by}) (avg_over_time({selector(RULES[kind], ns)}[{h}]))"
                         f" and on ({by}) {runs}", kind),
                    stat(f"max by ({GROUP}, signal) (avg_over_time("
                         f"{selector(RULES[median], ns)}[{h}]))"
                         f" and on ({GROUP}) {full(median, GROUP, ns)}"
                         f" and on ({GROUP}) {runs}", f"{kind}_median"),
                ]
            out[f"runs#{len(out)}"] = " or ".join(found)
        each(spinning, spin)
        each(devices, alloc)
        return out

    #: The most queries one page has in flight at once: VictoriaMetrics answers at most
    #: ``-search.maxConcurrentRequests`` (twice its cores: 4 on 2) and refuses more after
    #: waiting 10 s (HTTP 503); more at once gains nothing on a store of a few cores.
    MAX_IN_FLIGHT = 4

    #: Whether the fleet page asks the recording rules for run summaries (:meth:`run_queries`)
    #: where it can; False: every finding's steps (the same verdicts, slower; for tests).
    summaries = True

    #: With the rules, the fleet page reads the devices of the nodes that need them in node
    #: lists while they are at most this share of the fleet, else every device
    #: (:func:`detail_nodes`; 1.0 always lists them: for tests).
    detail_share = 0.5

    #: How long a finding about the recording rules (loaded or not) is kept, in seconds.
    RULES_CHECK_EVERY = 300.0

    def rules_loaded(self, window: Window) -> bool:
        """Whether the ``gpuscope-dashboard`` recording rules can serve ``window``: its step
        is a whole number of the rules' interval (and the lookback no longer), and every
        recorded series exists at the window's start and end (rules loaded after the
        window began leave it to the raw series). One instant query (``count`` of each at
        both ends, pinned with ``@``), which Prometheus and VictoriaMetrics answer alike
        (VictoriaMetrics has no ``/api/v1/rules`` without vmalert); the finding is kept for
        :attr:`RULES_CHECK_EVERY` seconds per window length."""
        return self._check_rules(window)[0]

    def _check_rules(self, window: Window) -> tuple[bool, int]:
        """:meth:`rules_loaded`, and how many queries that took (0 or 1)."""
        step_ms, every_ms = round(window.step * 1000), round(RULE_INTERVAL * 1000)
        if step_ms % every_ms or max(window.step, self.lookback) != window.step:
            return False, 0
        key = round(window.seconds)
        now = time.monotonic()
        with self._lock:
            found = self._rules_seen.get(key)
        if found is not None and now - found[0] < self.RULES_CHECK_EVERY:
            return found[1], 0
        probe = duration(RULE_INTERVAL)
        # The dense series (the sparse ones may rightly be empty: nothing spins), and the
        # rules' version (a rule file older than the page lacks what it reads).
        names = [RULES["util_max"], RULES["util"], RULES["version"]]
        ends = (window.start + window.step, window.end)
        # One sample when every series is there at both ends (``and`` of the counts).
        version = selector(RULES["version"], thresholds=self.thresholds.key)
        query = " and ".join(
            f"count(last_over_time({version if name == RULES['version'] else name}[{probe}]"
            f" @ {t:.3f}){f' >= {RULES_VERSION}' if name == RULES['version'] else ''})"
            for name in names for t in ends)
        loaded = len(self.instant(query, window.end)) == 1
        with self._lock:
            self._rules_seen[key] = (now, loaded)
        return loaded, 1

    def _submit(self, queries: Mapping[str, str], window: Window) -> _Answers:
        """Every query sent (at most :attr:`MAX_IN_FLIGHT` in flight, in this order), the
        answers to be read by role as they are needed (:class:`_Answers`)."""
        def one(name: str, promql: str) -> Any:
            if name.partition("#")[0] in self.RANGE_QUERIES:
                return self.range(promql, window)
            return self.instant(promql, window.end)

        pending: dict[str, list[Future[Any]]] = {}
        for name, promql in queries.items():
            try:
                fut = self._page_pool.submit(one, name, promql)
            except RuntimeError:  # closed: a page still computing when the dashboard stops
                raise DataError(f"{self.description}: closed") from None
            pending.setdefault(name.partition("#")[0], []).append(fut)
        return _Answers(pending)

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        """The fleet page's data: the rounds of queries of :meth:`fleet_queries`,
        :meth:`second_round` and :meth:`run_queries` (``docs/dashboard.md``), with the
        cyclic garbage collector held off (:func:`gc_paused`). With the recording rules,
        between the first two: :meth:`summary_queries` (each node's numbers, and over the
        default hour who uses what) and :meth:`detail_queries` (the devices and containers
        of the nodes that need them, :func:`detail_nodes`), or every device and container at
        once where the findings at the end name most of the fleet."""
        with gc_paused():
            return self._fleet(window or self.window(window_seconds), namespace)

    def _fleet(self, window: Window, namespace: str | None) -> FleetData:
        if namespace is not None:
            namespace = validate_namespace(namespace)
        rules, checks = self._check_rules(window)
        queries = self.fleet_queries(window, namespace, rules)
        first_res = self._submit(queries, window)  # each read as it is needed
        if namespace is not None:
            # Who uses what, on the nodes where the namespace ran (a small answer, among the
            # first four in flight), while the store computes the rest of the round.
            more_first = self.members_queries(
                window, namespace, {lab.get("node", "") for lab, _ in first_res["ns_nodes"]})
            queries.update(more_first)
            first_res.add(self._submit(more_first, window))
        th = self.thresholds

        nodes = {
            lab.get("node", ""): NodeInfo(
                lab.get("node", ""), lab.get("instance_type", ""), lab.get("zone", ""),
                lab.get("capacity_type", ""),
            )
            for lab, _ in first_res["nodes"] if "stat" not in lab
        }
        first: float | None = None
        if any(lab.get("stat") == "at_start" and v > 0 for lab, v in first_res["nodes"]):
            first = self._full_history_at(window)
        if first is None:  # no device reported at the window's first step
            checks += 1
            first = next((v for _, v in self.instant(self.first_query(window), window.end)
                          if math.isfinite(v)), None)
        idle_now: set[GpuRef] = set()
        spin_now: set[GpuRef] = set()
        silent: set[GpuRef] = set()
        held_nodes: set[str] = set()
        held_refs: set[ContainerRef] = set()
        judged: set[tuple[str, str]] = set()
        slow: set[tuple[str, str]] = set()
        # The devices the stragglers' rules flag at the end (one-minute steps), by group.
        flagged: dict[GroupKey, dict[GpuRef, str]] = {}
        straggler_rules = False
        for lab, _ in first_res["now"]:
            stat, ref = lab.get("stat", ""), _gref(lab)
            if stat == "idle":
                idle_now.add(ref)
            elif stat == "spin":
                spin_now.add(ref)
            elif stat == "silent":
                silent.add(ref)
            elif stat == "held_idle":
                held_nodes.add(ref.node)
                held_refs.add(_cref(lab))
            elif stat == "candidate":
                key2 = (lab.get("namespace", ""), lab.get("workload", ""))
                judged.add(key2)
                if lab.get("kind") == "slow":
                    slow.add(key2)
            elif stat in ("stalled", "slow"):
                flagged.setdefault(_group_key(lab), {})[ref] = stat
            elif stat == "straggler_rules":
                straggler_rules = True

        hs = self._history_start(window, first)
        steps = round((window.end - hs) / window.step)
        # With the rules on a one-minute step, each finding whose condition held at every
        # step of the history comes back as one summary (:meth:`run_queries`) instead of its
        # steps; the others' steps are asked for afterwards (a third round, usually empty).
        summarize = rules and self.summaries and steps >= 1 and self._minutes(window)
        # With the rules: each node's numbers, and the devices of the nodes that need them
        # (read before the second round's groups need the models).
        summaries: dict[str, NodeSummary] = {}
        inventory = first_res
        # The nodes a finding at the end names (their devices are read with the rules).
        named = {g.node for g in idle_now | spin_now | silent | {
                     g for devices in flagged.values() for g in devices}}
        named |= held_nodes
        lean = self.lean(window, namespace, rules)
        # Where those are most of the fleet already, every device (and container) is asked
        # for at once, before the summaries below (the heaviest answers, which the second
        # round waits for): node lists would name most nodes, and waiting for the nodes'
        # numbers to say so cost a round (57 % set, 5,000 nodes: 8.3 s a page against 6.6).
        asked_all = rules and len(named) > self.detail_share * max(1, len(nodes))

        def read_devices(on: Collection[str] | None, members: bool) -> _Answers:
            """:meth:`detail_queries` of ``on``, sent (and counted)."""
            detail = self.detail_queries(window, on, members)
            queries.update(detail)
            return self._submit(detail, window)

        if asked_all:
            inventory = read_devices(None, lean)
        elif rules:
            # Else the nodes' numbers, and who uses what from the rules, to say which nodes'
            # devices and containers to read.
            numbers = self.summary_queries(window, namespace)
            queries.update(numbers)
            first_res.add(self._submit(numbers, window))
        # The summaries need only what holds at the end and when data begins: sent now,
        # while the store still computes who is where (the heaviest answers of the round).
        run_q = self.run_queries(
            window, hs, devices={g.node for g in idle_now | spin_now},
            spinning={g.node for g in spin_now}, held=bool(held_refs),
            stragglers=bool(flagged),
            namespace=namespace) if summarize else {}
        answers = self._submit(run_q, window)  # the second round joins these

        pods = {}
        for lab, _ in first_res["pods"]:
            key = PodKey(lab.get("node", ""), lab.get("namespace", ""), lab.get("pod", ""))
            pods[key] = PodInfo(key.node, key.namespace, key.pod, lab.get("workload", ""))
        groups_checked: int | None = None
        if rules and not asked_all:
            summaries = _summaries(first_res["node_summary"])
            if lean:
                groups_checked = int(next((v for _, v in first_res["groups"]), 0))
        if lean and not asked_all:
            # Who uses what is read on the nodes that need it, known before it is: where the
            # rules saw a device shared or a container near the input-starved range, and
            # where the straggler candidates' workloads have pods.
            named |= {lab.get("node", "") for lab, _ in first_res["sharers"]}
            named |= {lab.get("node", "") for lab, _ in first_res["input_range"]}
            workloads = judged | {key[:2] for key in flagged}
            named |= {p.node for p in pods.values() if (p.namespace, p.workload) in workloads}
            inventory = read_devices(detail_nodes(named, summaries, self.detail_share), True)
        member_rows = (inventory if lean else first_res)["members"]

        # Every container in the window (with the rules over their window: on the nodes
        # that need it); a history only where a verdict can use one.
        # Each container's raw mean over the window (the input statistics' mean).
        member_mean = {_cref(lab): v for lab, v in member_rows if lab.get("namespace")}
        members = list(member_mean)
        # Input starvation's candidates: the raw mean in the rule's range (of the namespace
        # filtered to: the other containers on its devices are there for time-slicing).
        input_pods = {
            lab.get("pod", "") for lab, mean in member_rows
            if lab.get("namespace") and th.input_low <= mean <= th.input_high
            and (namespace is None or lab.get("namespace") == namespace)}

        sharers: dict[GpuRef, int] = {}
        for c in members:
            gpu = c.gpu
            sharers[gpu] = sharers.get(gpu, 0) + 1
        workload_nodes: dict[tuple[str, str], set[str]] = {}
        for c in members:
            pod = pods.get(c.pod_key)
            if pod is not None and pod.workload:
                workload_nodes.setdefault((c.namespace, pod.workload), set()).add(c.node)
        history = window.end - hs
        ask = FollowUp(
            idle={g.node for g in idle_now},
            # (``idle_nodes``: below, from the inventory, where the summaries are not used.)
            shared={g.node for g, n in sharers.items() if n >= 2},
            spinning={g.node for g in spin_now},
            held=held_nodes,
            candidates={n for k in judged for n in workload_nodes.get(k, ())},
            slow={n for k in slow for n in workload_nodes.get(k, ())},
            input=input_pods,
            evidence_seconds=(min(th.straggler_duration, window.seconds, max(history, 0.0))
                              if judged else 0.0),
        )
        if rules and not lean and not asked_all:
            # Who uses what came first: the devices of the nodes that need them, asked now.
            named |= set(ask.shared) | set(ask.candidates)
            named |= set(ask.slow) | {c.node for c in member_mean if c.pod in input_pods}
            named |= {n for key in flagged for n in workload_nodes.get(key[:2], ())}
            inventory = read_devices(detail_nodes(named, summaries, self.detail_share), False)
        node_models = {n: s.model for n, s in summaries.items()}
        # The stragglers summarised whole: their groups' step histories, which replace any
        # others asked about their devices (a node's every device comes back).
        strag_containers: dict[ContainerRef, Series] = {}
        strag_signals: dict[str, dict[GpuRef, Series]] = {}
        strag_devices: set[GpuRef] = set()
        if summarize:
            # The stragglers' rules at the end say which workloads can hold one: their
            # evidence now, and their steps only where the summaries do not describe them.
            flagged_workloads = {key[:2] for key in flagged}
            strag_ask: dict[str, Any] = {} if not straggler_rules else {
                "candidates": (), "slow": (),
                "evidence": {n for k in flagged_workloads for n in workload_nodes.get(k, ())},
                "evidence_seconds": (min(th.straggler_duration, window.seconds,
                                         max(history, 0.0)) if flagged else 0.0)}
            more = self.second_round(window, replace(
                ask, idle=(), spinning=(), held=(), **strag_ask),
                namespace, rules)
            answers.add(self._submit(more, window))
        # The inventory (sent after who uses what): with the summaries, read while the
        # store computes the second round.
        gpus = {}
        for lab, _ in inventory["gpus"]:
            info = GpuInfo(
                node=lab.get("node", ""), gpu=lab.get("gpu", ""), uuid=lab.get("uuid", ""),
                model=lab.get("model", ""), parent_uuid=lab.get("parent_uuid", ""),
                mig_profile=lab.get("mig_profile", ""),
            )
            gpus[info.ref] = info
        if not summarize:
            # Nodes idle now (every whole GPU, or every slice of one in MIG mode, idle or
            # spinning): the waste split asks when their devices were held.
            slices_of: dict[GpuRef, list[GpuRef]] = {}
            for info in gpus.values():
                if not info.is_physical:
                    slices_of.setdefault(GpuRef(info.node, info.parent_uuid), []).append(
                        info.ref)
            node_idle: dict[str, bool] = {}
            for info in gpus.values():
                if info.is_physical:
                    parts = slices_of.get(info.ref) or [info.ref]
                    node_idle[info.node] = node_idle.get(info.node, True) and all(
                        p in idle_now or p in spin_now for p in parts)
            # The waste split (idle nodes) and an idle MIG slice's "allocated" (busy nodes)
            # need when each idle device was held: every node with an idle or spinning one.
            more = self.second_round(window, replace(
                ask, idle_nodes={n for n, idle in node_idle.items() if idle}
                | {g.node for g in idle_now} | {g.node for g in spin_now}),
                namespace, rules)
            answers.add(self._submit(more, window))
        more.update(run_q)
        # What needs no answer of this round, while the store computes them.
        containers: dict[ContainerRef, Series] = dict.fromkeys(members, _NO_POINTS)
        groups = _groups(members, pods, gpus, node_models) if summarize else {}
        synthesized: dict[str, list[tuple[dict[str, str], Series]]] = {}
        extra: dict[str, str] = {}
        extra_res: _Answers | None = None
        if summarize:
            # The summaries, sent first, are in before the rest of the round: read and
            # expanded (and the third round sent) while the store computes the rest.
            rows = answers["runs"]
            runs = _FullRuns.parse(rows, window, steps)
            again = runs.fallback(idle_now, spin_now, held_refs)
            strag = _StragglerRuns.parse(rows, runs.grid)
            whole, rest = strag.split(flagged, groups, spin_now | {
                g for g, n in sharers.items() if n >= 2})
            rest_workloads = {key[:2] for key in rest}
            again = replace(
                again,
                candidates={n for k in rest_workloads for n in workload_nodes.get(k, ())},
                slow={n for key in rest if "slow" in flagged[key].values()
                      for n in workload_nodes.get(key[:2], ())})
            strag_containers, strag_signals = strag.synthesize(whole, groups, th.slow_busy)
            strag_devices = {g for key in whole for g in groups[key]}
            extra = self.second_round(window, again, namespace, rules, by_node=True)
            extra_res = self._submit(extra, window) if extra else None
            # The summaries first: a step history asked again overrides them.
            synthesized = runs.results()
        # Each device's window mean (sent last in the first round), while the rest runs.
        gpu_mean = {_gref(lab): v for lab, v in inventory["gpu_stats"]}
        later = answers.all()
        later.pop("runs", None)
        if extra_res is not None:
            for role, rows in extra_res.all().items():
                synthesized.setdefault(role, []).extend(rows)
        for role, rows in synthesized.items():
            later.setdefault(role, []).extend(rows)
        more.update(extra)

        containers.update({_cref(lab): s for lab, s in later.get("containers", [])
                           if lab.get("namespace")})
        containers.update(strag_containers)
        stats_parts: dict[ContainerRef, dict[str, float]] = {}
        for lab, v in later.get("stats", []):
            stats_parts.setdefault(_cref(lab), {})[lab.get("stat", "")] = v
        # The raw mean is the first round's (``members``: the same expression).
        stats = {
            ref: UtilStats(
                mean=member_mean[ref], stddev=p.get("stddev", 0.0),
                samples=int(p.get("count", 0)), memory_bytes=p.get("memory", 0.0),
            )
            for ref, p in stats_parts.items() if ref in member_mean
        }
        busy_max: dict[GpuRef, Series] = {}
        idle_signal: dict[GpuRef, str] = {}
        for lab, s in later.get("idle_steps", []):
            ref = _gref(lab)
            busy_max[ref] = s
            idle_signal[ref] = lab.get("signal", "utilization")
        usage, usage_signal = _merge_signals(
            (_cref(lab), lab.get("signal", "utilization"), s)
            for lab, s in later.get("held_idle", []) if lab.get("namespace"))
        by_signal: dict[str, dict[GpuRef, Series]] = {}
        for lab, s in [*later.get("spinning", []), *later.get("workload_signals", [])]:
            if _gref(lab) not in strag_devices:
                by_signal.setdefault(lab.get("signal", ""), {})[_gref(lab)] = s
        for name, mine in strag_signals.items():
            by_signal.setdefault(name, {}).update(mine)
        limits = {ref: s.values[-1] for ref, s in by_signal.pop("limit", {}).items()
                  if s.values}
        signals = WorkSignals(
            utilization=by_signal.get("utilization", {}), sm=by_signal.get("sm", {}),
            tensor=by_signal.get("tensor", {}), dram=by_signal.get("dram", {}),
            power=by_signal.get("power", {}), power_limit=limits,
            gpm=frozenset(by_signal.get("sm", {})),
        )
        shared = {g for g, n in sharers.items() if n >= 2}
        return FleetData(
            window=window,
            history_start=hs,
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max=busy_max,
            gpu_mean=gpu_mean,
            gpu_step_mean={_gref(lab): s for lab, s in later.get("shared", [])
                           if _gref(lab) in shared},
            allocated={_gref(lab): s for lab, s in later.get("allocated", [])},
            containers=containers,
            container_stats=stats,
            pods=pods,
            idle_signal=idle_signal,
            signals=signals,
            evidence=_evidence(later.get("evidence", [])),
            held_usage=usage,
            held_signal=usage_signal,
            queries=len(queries) + len(more) + checks,
            silent=frozenset(silent),
            notes=(("Read from the gpuscope-dashboard recording rules.",) if rules else
                   (RAW_NOTE.format(nodes=len(nodes), most=RAW_NODES),)
                   if len(nodes) > RAW_NODES else ()),
            node_summaries=summaries,
            workloads_checked=groups_checked,
        )

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """Each query's kept steps over the fleet page's window (:meth:`window`), all asked in
        one range query through the page's pool: :func:`.steps.combined` of each query's text
        (:func:`.steps.promql`, ranges from :attr:`lookback`; a query with ``on`` whole,
        ``(...) and on (node, uuid) (...)``: its ``on`` restricts it in the store), each tagged
        with its position in :data:`.steps.STEP_LABEL`; the answer is split back by that label,
        which is then removed. Over :data:`MAX_QUERY_BYTES`, the list is sent in parts as the
        node lists are (halves, down to one query each), side by side. Each series' labels are
        ``node`` and the query's ``by`` (those the series has); its times are steps of the
        window; a query's series are in the order of their label sets, as both stores sort a
        query's answer: the same answers as one query each (:meth:`_step_series_each`).
        DataError if any part fails (the whole answer). Where the recording rules are
        loaded for the window (:meth:`rules_loaded`), a query with a
        :attr:`~.steps.StepQuery.recorded` form is sent in that form."""
        window = window or self.window(window_seconds)
        unique = list(dict.fromkeys(queries))
        recorded = (any(q.as_recorded is not q for q in unique)
                    and self.rules_loaded(window))
        texts = {str(i): step_promql(q.as_recorded if recorded else q, window.step,
                                     self.lookback)
                 for i, q in enumerate(unique)}
        futures = []
        for text in _split(list(texts), lambda part: combined({int(i): texts[i] for i in part})):
            try:
                futures.append(self._page_pool.submit(self.range, text, window))
            except RuntimeError:  # closed: a page still computing when the dashboard stops
                raise DataError(f"{self.description}: closed") from None
        rows: dict[str, list[tuple[dict[str, str], Series]]] = {i: [] for i in texts}
        for fut in futures:
            for lab, series in fut.result():
                mine = rows.get(lab.pop(STEP_LABEL, ""))
                if mine is None:  # not a label of ours: not an answer to these queries
                    raise DataError(f"{self.description}: a step query's series without its "
                                    f"{STEP_LABEL} label")
                mine.append((lab, series))
        # ``or`` answers the queries' series interleaved, sorted with the position label
        # among the others; each query's in the order its own answer has (Prometheus'
        # ``labels.Compare``, VictoriaMetrics' ``metricNameLess``: the sorted pairs).
        return {q: sorted(rows[i], key=lambda row: sorted(row[0].items()))
                for i, q in zip(texts, unique, strict=True)}

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

    def _full_history_at(self, window: Window) -> float:
        """The earliest time data must reach back to for the verdicts' history to begin at
        the window's start: one rate range before its first step's end (see
        :meth:`_history_start`)."""
        return window.start - max(window.step, 2 * self.lookback) + window.step

    def _history_start(self, window: Window, first: float | None) -> float:
        """Where the verdicts' history begins: a rate over the range r is the mean over r
        only once a series is r old (before, Prometheus divides what little increase there
        is by all of r), so the rate-based verdicts' history begins r after the data does."""
        if first is None:
            return window.end
        rate_range = max(window.step, 2 * self.lookback)
        return min(window.end, max(window.start, first - window.step + rate_range))

    def node_queries(self, node: str, window: Window) -> dict[str, str]:
        node = validate_node(node)
        r, rr = self._r(window)
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
                f'label_replace({_rate(f"gpu_{name}_active_seconds_total", rr, match, "gpu")},'
                f' "signal", "{name}", "", "")' for name in ("sm", "tensor", "dram")
            ),
            "power": (f"max by (gpu) ({_power_step(rr, match, 'node, gpu, uuid')}"
                      f" / on (node, uuid) group_left () max by (node, uuid) ({limit}))"),
            "throttle": f"max by (gpu, reason) (rate({throttle}[{rr}]))",
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
                         nodes: Sequence[str] = ()) -> dict[str, str]:
        """The devices of one workload (``members``: an instant query over the window; their
        index and model are read by :func:`index_queries`, on their nodes), and the
        utilization, SM activity and power per step of the devices on ``nodes``
        (``workload``, ``workload#1``...: the node list split to keep each query short;
        the caller keeps the workload's devices)."""
        namespace, workload = validate_namespace(namespace), validate_workload(workload)
        _, rr = self._r(window)
        w = duration(window.seconds)
        cutil = selector("container_gpu_utilization_ratio", namespace=namespace)
        pods = selector("gpu_pod_info", namespace=namespace, workload=workload)
        out = {
            "members": (
                f"max by (node, uuid, pod) (last_over_time({cutil}[{w}])"
                f" * on (node, namespace, pod) group_left ()"
                f" max by (node, namespace, pod) (last_over_time({pods}[{w}])))"),
        }

        def signals(names: Sequence[str]) -> str:
            match = {"node": f'=~"{any_of(names)}"'}
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
                        first: Collection[GpuRef] = ()) -> WorkloadDetail:
        window = self.window(window_seconds)
        members = self.instant(self.workload_queries(namespace, workload, window)["members"],
                               window.end)
        pods: dict[GpuRef, set[str]] = {}
        for lab, _ in members:
            pods.setdefault(_gref(lab), set()).add(lab.get("pod", ""))
        asked = index_queries({ref.node for ref in pods})
        index = self._index(asked, window.end)
        # A device without gpu_info at the end (gone, or its slice remade) is left out, as a
        # join with gpu_info would.
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
        """Each device's index and model at ``at``, from ``asked`` (:func:`index_queries`)."""
        futures = [self._pool.submit(self.instant, q, at) for q in asked]
        return {_gref(lab): (lab.get("gpu", ""), lab.get("model", ""))
                for fut in futures for lab, _ in fut.result()}

    def pod_queries(self, namespace: str, pod: str, window: Window) -> dict[str, str]:
        """One pod's utilization and memory per container and device, per step (the
        devices' index is read afterwards by :func:`index_queries`, on the pod's node)."""
        namespace, pod = validate_namespace(namespace), validate_pod(pod)
        r, _ = self._r(window)
        util = selector("container_gpu_utilization_ratio", namespace=namespace, pod=pod)
        mem = selector("container_gpu_memory_used_bytes", namespace=namespace, pod=pod)
        by = "node, container, uuid"
        return {
            "utilization": f"max by ({by}) (avg_over_time({util}[{r}]))",
            "memory": f"max by ({by}) (avg_over_time({mem}[{r}]))",
        }

    def pod_detail(self, namespace: str, pod: str, window_seconds: float) -> PodDetail:
        window = self.window(window_seconds)
        queries = self.pod_queries(namespace, pod, window)
        futures = {k: self._pool.submit(self.range, q, window) for k, q in queries.items()}
        res = {k: f.result() for k, f in futures.items()}
        asked = index_queries({lab.get("node", "") for rows in res.values() for lab, _ in rows})
        index = self._index(asked, window.end)

        def by_key(rows: list[tuple[dict[str, str], Series]]) -> dict[str, Series]:
            # A device without gpu_info at the end is left out, as a join would.
            return {f"{lab.get('container')} ({lab.get('node')} GPU {index[ref][0]})": s
                    for lab, s in rows if (ref := _gref(lab)) in index}

        return PodDetail(
            namespace=namespace, pod=pod, window=window,
            utilization=by_key(res["utilization"]), memory_used=by_key(res["memory"]),
            queries=len(queries) + len(asked),
        )


