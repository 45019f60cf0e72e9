"""Stragglers: within one workload (the pods of one job, ``gpu_pod_info``'s ``workload``),
the GPU that holds the others back. GPUs are compared like with like: a workload's devices
are grouped by GPU model, and each group is judged on its own (>= 2 devices).

- *stalled*: a GPU whose utilization is below ``factor`` (0.5) x the group's median at every
  step for >= ``duration`` (10 min, shortened to the window and the history collected): a
  rank that waits while its peers work. A "GPU" here is one device as the workload uses it:
  the summed utilization of the workload's containers on that device.
- *slow*: while every GPU of the group shows utilization >= ``slow_busy`` (0.8), a GPU whose
  SM activity (where every GPU of the group has GPM; else its power) is >= ``slow_factor``
  (1.3) x the group's median, for the same duration: in a synchronous job the slow rank works
  while its peers spin at 100 % waiting for it, so utilization cannot tell them apart and
  the work signals can.

The median is taken over the group's devices present at each step, the straggler included.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuscope.dashboard import fmt, ids
from gpuscope.dashboard.data.promql import node_parts, summed_rate
from gpuscope.dashboard.data.recorded import (
    GBY,
    GROUP,
    MEMBER,
    RULE_R,
    RULES,
    History,
    Steps,
)
from gpuscope.dashboard.links import at_node, node_link, pod_link, workload_link
from gpuscope.dashboard.series import (
    ContainerRef,
    GpuInfo,
    GpuRef,
    GroupKey,
    GroupRun,
    PodInfo,
    PodKey,
    Runs,
    Series,
    Window,
    WorkSignals,
)
from gpuscope.dashboard.verdicts.cells import for_cell
from gpuscope.dashboard.verdicts.common import (
    Run,
    holds,
    is_fresh,
    required_seconds,
    trailing_run,
    whole_run,
)
from gpuscope.dashboard.verdicts.mig import slice_share_promql
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table, Threshold
from gpuscope.dashboard.verdicts.runs import RecordedRun, RunRule, recorded

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.verdicts.page import PageContext

STRAGGLER_FACTOR = 0.5
STRAGGLER_DURATION = 10 * 60.0
SLOW_FACTOR = 1.3
SLOW_BUSY = 0.8

THRESHOLDS = (
    Threshold("straggler_factor", "factor",
              "stalled: a workload's GPU below this times its group's median utilization, "
              "..."),
    Threshold("straggler_duration", "seconds",
              "... for at least this long (the slow ranks too)"),
    Threshold("slow_factor", "factor",
              "slow: a GPU at this times its group's median work (SM activity, else power) "
              "or more, ..."),
    Threshold("slow_busy", "ratio", "... while every GPU of the group is at least this busy"),
)

@dataclass(frozen=True, slots=True)
class Straggler:
    """``kind``: ``stalled`` or ``slow``; ``signal``: what was compared (``utilization``,
    ``sm`` or ``power``); ``value`` and ``median`` are means over the straggling run."""

    namespace: str
    workload: str
    gpu: GpuRef
    pods: tuple[str, ...]
    value: float
    median: float
    since: float
    seconds: float
    required_seconds: float
    devices: int
    kind: str = "stalled"
    signal: str = "utilization"
    model: str = ""
    cluster: str = ""

    @property
    def key(self) -> GroupKey:
        """Its group's key."""
        return (self.cluster, self.namespace, self.workload, self.model)

    @property
    def utilization(self) -> float:
        return self.value

    @property
    def ratio(self) -> float:
        return self.value / self.median if self.median > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Group:
    """The devices of one workload of one GPU model: per device, per step, the summed
    utilization of the workload's containers on it, and the pods on it."""

    key: GroupKey
    devices: Mapping[GpuRef, Mapping[float, float]]
    pods: Mapping[GpuRef, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class StragglerReport:
    stragglers: tuple[Straggler, ...]
    workloads_checked: int
    groups: tuple[Group, ...] = ()


def group_of(ref: ContainerRef, pods: Mapping[PodKey, PodInfo],
             gpus: Mapping[GpuRef, GpuInfo],
             node_models: Mapping[str, str] | None = None) -> GroupKey | None:
    """The straggler group of a container's device: its pod's workload and the device's
    GPU model (None where the pod has no workload). The one definition for the analysis
    and for the Prometheus mode's run summaries, which must group alike. ``node_models``:
    the one model of each node's devices, for devices ``gpus`` lacks (the Prometheus mode
    sends some nodes as numbers, :class:`..series.NodeSummary`)."""
    info = pods.get(ref.pod_key)
    if info is None or not info.workload:
        return None
    cluster = node_parts(ref.node)[0]
    found = gpus.get(ref.gpu)
    if found is not None:
        return (cluster, ref.namespace, info.workload, found.model)
    return (cluster, ref.namespace, info.workload,
            node_models.get(ref.node, "") if node_models else "")


def workload_groups(
    containers: Mapping[ContainerRef, Series],
    pods: Mapping[PodKey, PodInfo],
    gpus: Mapping[GpuRef, GpuInfo] | None = None,
    node_models: Mapping[str, str] | None = None,
) -> list[Group]:
    """Every workload's devices, grouped by model (all of them, even single ones);
    ``node_models`` as :func:`group_of`'s."""
    gpus = gpus or {}
    per: dict[GroupKey, dict[GpuRef, dict[float, float]]] = {}
    names: dict[GroupKey, dict[GpuRef, set[str]]] = {}
    # 10^5 containers on a large fleet, most with no step asked: each dict is looked up
    # once and made only when missing (``setdefault`` would build one for every container).
    for ref, series in containers.items():
        key = group_of(ref, pods, gpus, node_models)
        if key is None:
            continue
        gpu = ref.gpu
        devices = per.get(key)
        if devices is None:
            devices = per[key] = {}
            names[key] = {}
        per_time = devices.get(gpu)
        if per_time is None:
            per_time = devices[gpu] = {}
            names[key][gpu] = {ref.pod}
        else:
            names[key][gpu].add(ref.pod)
        if series.times:
            if not per_time:
                # The device's first series (most devices have one container): its points
                # as they are, copied in C.
                per_time.update(zip(series.times, series.values, strict=True))
            else:
                get = per_time.get
                for t, v in zip(series.times, series.values, strict=True):
                    per_time[t] = get(t, 0.0) + v
    return [
        Group(key, devices, {g: tuple(sorted(names[key][g])) for g in devices})
        for key, devices in sorted(per.items())
    ]


def _median(values: list[float]) -> float:
    """:func:`statistics.median`'s value (the same sort and the same arithmetic), without
    its overhead: the stragglers take 10^5 medians of a few values on a large fleet."""
    values.sort()
    n = len(values)
    if n % 2 == 1:
        return values[n // 2]
    i = n // 2
    return (values[i - 1] + values[i]) / 2


def _medians(values: Mapping[GpuRef, Mapping[float, float]]) -> dict[float, float]:
    # Each step's values in the order of the devices, as a scan of the devices per step
    # would list them (one pass over the points instead of one per step).
    present: dict[float, list[float]] = {}
    for v in values.values():
        for t, x in v.items():
            at = present.get(t)
            if at is None:
                present[t] = [x]
            else:
                at.append(x)
    return {t: _median(at) for t, at in present.items() if len(at) >= 2}


def _stalled(group: Group, window: Window, history_start: float, required: float,
             factor: float) -> list[Straggler]:
    medians = _medians(group.devices)
    found = []
    for gpu, values in group.devices.items():
        own = sorted(values)
        if not is_fresh(own, window):
            continue
        flags = [t in medians and values[t] < factor * medians[t] for t in own]
        run = trailing_run(own, flags, window.step, history_start)
        if run is None or not holds(run, required):
            continue
        run_times = own[run.first_index:]
        cluster, namespace, workload, model = group.key
        found.append(Straggler(
            namespace=namespace, workload=workload, gpu=gpu, pods=group.pods[gpu],
            value=sum(values[t] for t in run_times) / len(run_times),
            median=sum(medians[t] for t in run_times) / len(run_times),
            since=run.start, seconds=run.seconds, required_seconds=required,
            devices=len(group.devices), kind="stalled", signal="utilization", model=model,
            cluster=cluster,
        ))
    return found


def _slow(group: Group, signals: WorkSignals, window: Window, history_start: float,
          required: float, factor: float, busy: float) -> list[Straggler]:
    members = list(group.devices)
    if sum(1 for g in members if g in signals.utilization) < 2:
        return []  # nothing to compare (the Prometheus mode sends candidates' signals only)
    signal = "sm" if all(g in signals.gpm for g in members) else "power"
    measure = signals.sm if signal == "sm" else signals.power
    util = {g: signals.utilization[g].at() for g in members if g in signals.utilization}
    value = {g: measure[g].at() for g in members if g in measure}
    if len(util) < 2 or len(value) < 2:
        return []  # nothing to compare (the Prometheus mode sends candidates' signals only)
    # Each step's devices in the order of ``members`` (one pass over the points).
    at_step: dict[float, list[GpuRef]] = {}
    for g in members:
        for t in group.devices[g]:
            present = at_step.get(t)
            if present is None:
                at_step[t] = [g]
            else:
                present.append(g)
    medians: dict[float, float] = {}
    for t, present in at_step.items():
        if len(present) < 2:
            continue
        if not all(t in util.get(g, {}) and util[g][t] >= busy for g in present):
            continue
        if not all(t in value.get(g, {}) for g in present):
            continue
        medians[t] = _median([value[g][t] for g in present])
    found = []
    for gpu in members:
        if gpu not in value:
            continue
        mine = value[gpu]
        # Before its measure's first value nothing is known (a rate begins once its counter
        # is as old as the rate's range): the device's steps begin there, as in spinning.
        begins = min(mine, default=None)
        own = [t for t in sorted(group.devices[gpu]) if begins is None or t >= begins]
        if not is_fresh(own, window):
            continue
        flags = [t in medians and medians[t] > 0 and mine[t] >= factor * medians[t]
                 for t in own]
        run = trailing_run(own, flags, window.step, history_start)
        if run is None or not holds(run, required):
            continue
        run_times = own[run.first_index:]
        cluster, namespace, workload, model = group.key
        found.append(Straggler(
            namespace=namespace, workload=workload, gpu=gpu, pods=group.pods[gpu],
            value=sum(mine[t] for t in run_times) / len(run_times),
            median=sum(medians[t] for t in run_times) / len(run_times),
            since=run.start, seconds=run.seconds, required_seconds=required,
            devices=len(members), kind="slow", signal=signal, model=model, cluster=cluster,
        ))
    return found


def _whole(group: Group, summary: GroupRun, run: Run, required: float) -> list[Straggler]:
    """The stragglers of a group the store found whole: its findings, over the history's
    run."""
    cluster, namespace, workload, model = group.key
    return [Straggler(
        namespace=namespace, workload=workload, gpu=gpu, pods=group.pods.get(gpu, ()),
        value=value, median=summary.median, since=run.start, seconds=run.seconds,
        required_seconds=required, devices=len(group.devices), kind=summary.kind,
        signal=summary.signal, model=model, cluster=cluster)
        for gpu, value in summary.devices.items() if gpu in group.devices]


def slow_candidates(
    groups: Sequence[Group],
    signals: WorkSignals,
    at: float,
    *,
    factor: float = SLOW_FACTOR,
    busy: float = SLOW_BUSY,
) -> dict[GroupKey, set[GpuRef]]:
    """The groups in which the slow-rank condition holds at time ``at`` (every GPU present
    then busy, one at ``factor`` x the median's SM activity, else power, or more), with the
    GPUs that meet it. A verdict needs it at the latest step, so only these groups need
    their history looked at."""
    out: dict[GroupKey, set[GpuRef]] = {}
    for group in groups:
        members = [g for g, values in group.devices.items() if at in values]
        if len(members) < 2:
            continue
        sm = all(g in signals.gpm for g in group.devices)
        measure = signals.sm if sm else signals.power
        util = [signals.utilization[g].at().get(at) if g in signals.utilization else None
                for g in members]
        value = [measure[g].at().get(at) if g in measure else None for g in members]
        if any(u is None or u < busy for u in util) or any(v is None for v in value):
            continue
        present = [v for v in value if v is not None]
        median = statistics.median(present)
        slow = {g for g, v in zip(members, value, strict=True)
                if median > 0 and v is not None and v >= factor * median}
        if slow:
            out[group.key] = slow
    return out


def stragglers(
    containers: Mapping[ContainerRef, Series],
    pods: Mapping[PodKey, PodInfo],
    window: Window,
    history_start: float,
    *,
    gpus: Mapping[GpuRef, GpuInfo] | None = None,
    node_models: Mapping[str, str] | None = None,
    signals: WorkSignals | None = None,
    groups: Sequence[Group] | None = None,
    runs: Runs | None = None,
    factor: float = STRAGGLER_FACTOR,
    duration: float = STRAGGLER_DURATION,
    slow_factor: float = SLOW_FACTOR,
    slow_busy: float = SLOW_BUSY,
) -> StragglerReport:
    """Stalled stragglers, and slow ones where ``signals`` are given. ``gpus`` gives the
    models to group by (without it, every device of a workload is one group), with
    ``node_models`` (:func:`group_of`); ``groups``, the groups when they are known already
    (:func:`workload_groups`); ``runs``: the groups the store found whole
    (:class:`~..series.Runs`), whose stragglers are its findings (their containers come
    with no steps)."""
    required = required_seconds(duration, window, history_start)
    if groups is None:
        groups = workload_groups(containers, pods, gpus, node_models)
    found: list[Straggler] = []
    checked = 0
    whole = runs.stragglers if runs is not None else {}
    run = whole_run(runs.steps, window, history_start) if runs is not None and whole else None
    for group in groups:
        if len(group.devices) < 2:
            continue
        checked += 1
        summary = whole.get(group.key)
        if summary is not None:
            if run is not None and holds(run, required):
                found.extend(_whole(group, summary, run, required))
            continue
        if not any(group.devices.values()):
            # No device of the group has a step (the Prometheus mode asks the history of
            # the candidates' workloads only): neither rule can hold, and a fleet has 10^3
            # such groups.
            continue
        found.extend(_stalled(group, window, history_start, required, factor))
        if signals is not None:
            found.extend(_slow(group, signals, window, history_start, required, slow_factor,
                               slow_busy))
    found.sort(key=lambda s: (s.namespace, s.workload, s.gpu))
    return StragglerReport(tuple(found), checked, tuple(groups))


# -- on the page -----------------------------------------------------------------------------

STRAGGLER_COLUMNS = (
    Column("kind", "Kind"),
    Column("workload", "Workload", "link"),
    Column("namespace", "Namespace"),
    Column("pods", "Pod", "link"),
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("measure", "Compared"),
    # On the page in % (utilization, SM activity) or W (power); in the CSV as numbers (a
    # fraction, or watts: the "Compared" column says which).
    Column("value", "Value", csv="value_number"),
    Column("median", "Workload median", csv="median_number"),
    Column("ratio", "Ratio", "ratio"),
    Column("for", "For"),
    Column("evidence", "Evidence"),
    Column("devices", "GPUs compared", "count"),
    Column("price", "GPUs' $/hour", "money"),
)
SECTION = Section(
    id=ids.SECTION_STRAGGLERS, title="Stragglers",
    intro="Within one workload (the pods of one job, GPUs of the same model compared), the "
          "GPU that holds the others back: stalled (far below the median utilization) or "
          "slow (every GPU busy, this one doing far more work while its peers spin waiting "
          "for it), with the evidence of its cause.",
    tables=(Table(ids.STRAGGLERS_TABLE, ids.STRAGGLERS_NOTE, STRAGGLER_COLUMNS,
                  order="price"),),
)

# -- its findings as table rows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Compared:
    """One piece of a straggler's evidence: its own value against the workload's median
    (None where unknown)."""

    own: float | None
    median: float | None


@dataclass(frozen=True, slots=True)
class StragglerEvidence:
    """``throttle``: seconds per second by reason (those where the straggler or its peers
    throttle); ``seconds``: how far back it looks."""

    throttle: Mapping[str, Compared] = field(default_factory=dict)
    sm_clock_hertz: Compared = Compared(None, None)
    temperature_celsius: Compared = Compared(None, None)
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class StragglerRow:
    """``kind``: ``stalled`` (waits while its peers work: utilization far below the median)
    or ``slow`` (works while its peers spin: SM activity, else power, far above it);
    ``value`` and ``median`` are of ``signal`` (``utilization``, ``sm`` ratio, ``power``
    watts), means over the straggling run; ``price_per_hour``: the $/hour of the group's
    GPUs (``devices`` whole GPUs, each its share of its node's price), which the straggler
    holds back (None: a price unknown); ``evidence``: None where it is not read (a row
    the page does not show yet, or the store failed)."""

    namespace: str
    workload: str
    pods: tuple[str, ...]
    node: str
    gpu: str
    value: float
    median: float
    since: float
    seconds: float
    required_seconds: float
    devices: int
    kind: str = "stalled"
    signal: str = "utilization"
    model: str = ""
    evidence: StragglerEvidence | None = field(default_factory=StragglerEvidence)
    uuid: str = ""
    price_per_hour: float | None = None

    @property
    def utilization(self) -> float:
        return self.value

    @property
    def ratio(self) -> float:
        return self.value / self.median if self.median > 0 else 0.0


_MEASURES = {"utilization": "utilization", "sm": "SM activity", "power": "power (W)"}


def _measure(signal: str, value: float) -> str:
    return f"{value:.0f} W" if signal == "power" else fmt.pct(value)


#: Throttle reasons in the order a cause is named; ``app_clocks`` ("any of those") and
#: ``base_clocks`` only sum the others up, and ``low_utilization`` is idle clocks.
CAUSES = ("thermal", "sw_thermal", "hw_thermal", "power", "hw_power_brake", "reliability",
          "board_limit", "sync_boost")
_CAUSE_NAMES = {"thermal": "heat", "sw_thermal": "heat", "hw_thermal": "heat",
                "power": "power cap", "hw_power_brake": "power brake",
                "reliability": "reliability limit", "board_limit": "board limit",
                "sync_boost": "sync boost"}


def evidence_text(e: StragglerEvidence | None) -> str:
    """Its cause, as the throttling by reason, SM clock and temperature show it against the
    workload's median: ``throttled by heat: thermal 50% of the time (median 0%), ...``
    (None: the store could not be asked)."""
    if e is None:
        return "not read (see the page's notes)"
    parts = []
    throttled = sorted(
        ((r, c) for r, c in e.throttle.items()
         if r in CAUSES and (c.own or 0.0) >= 0.05 and (c.own or 0.0) - (c.median or 0.0) >= 0.05),
        key=lambda rc: (-(rc[1].own or 0.0), CAUSES.index(rc[0])))[:3]
    if throttled:
        cause = _CAUSE_NAMES[throttled[0][0]]
        parts.append(f"throttled by {cause}: " + ", ".join(
            f"{r} {fmt.pct(c.own)} of the time (median {fmt.pct(c.median)})"
            for r, c in throttled))
    else:
        parts.append("not throttled more than its peers")
    clock, temp = e.sm_clock_hertz, e.temperature_celsius
    if clock.own is not None:
        parts.append(f"SM clock {clock.own / 1e9:.2f} GHz"
                     + (f" (median {clock.median / 1e9:.2f})" if clock.median else ""))
    if temp.own is not None:
        parts.append(f"{temp.own:.0f} °C"
                     + (f" (median {temp.median:.0f} °C)" if temp.median is not None else ""))
    return "; ".join(parts) + (f" (last {fmt.duration(e.seconds)})" if e.seconds else "")



def straggler_rows(report: StragglerReport, ctx: PageContext,
                   device_price: Callable[[GpuRef], float | None],
                   ) -> tuple[StragglerRow, ...]:
    """The stragglers' rows, dearest group first: each straggler of ``report`` the page
    shows, with its group's GPUs' $/hour (the sum of ``device_price`` over them; None where
    one's price is unknown); their evidence not read yet (``evidence.RowEvidence`` reads
    it)."""
    groups = {g.key: g for g in report.groups}
    prices: dict[GroupKey, float | None] = {}

    def group_price(key: GroupKey) -> float | None:
        """Each group's once (its rows' order and each row ask)."""
        group = groups.get(key)
        if group is None:
            return None
        if key not in prices:
            each = [device_price(ref) for ref in group.devices]
            prices[key] = None if any(p is None for p in each) else math.fsum(
                p for p in each if p is not None)
        return prices[key]

    return tuple(
        StragglerRow(
            namespace=s.namespace, workload=s.workload, pods=s.pods, node=s.gpu.node,
            gpu=ctx.index(s.gpu), value=s.value, median=s.median,
            since=s.since, seconds=s.seconds, required_seconds=s.required_seconds,
            devices=s.devices, kind=s.kind, signal=s.signal, model=s.model,
            evidence=None, uuid=s.gpu.uuid, price_per_hour=group_price(s.key),
        )
        for s in sorted(report.stragglers, key=lambda s: (
            -(group_price(s.key) or 0.0), s.namespace, s.workload, s.gpu))
        if ctx.wanted(s.namespace)
    )


def straggler_data(rows: Sequence[StragglerRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "kind": ("slow: its peers wait for it" if r.kind == "slow"
                     else "stalled: waits while its peers work"),
            "workload": workload_link(r.namespace, r.workload, at_node(state, r.node)),
            "namespace": r.namespace,
            "pods": ", ".join(pod_link(r.namespace, p, at_node(state, r.node)) for p in r.pods),
            "node": node_link(r.node, state), "gpu": r.gpu,
            "measure": _MEASURES.get(r.signal, r.signal) + (f" ({r.model})" if r.model else ""),
            "value": _measure(r.signal, r.value), "median": _measure(r.signal, r.median),
            "value_number": r.value, "median_number": r.median,
            "ratio": r.ratio,
            "for": for_cell(r.seconds, r.required_seconds),
            "evidence": evidence_text(r.evidence),
            "devices": r.devices, "price": r.price_per_hour,
        }
        for r in rows
    ]


# -- as PromQL --------------------------------------------------------------------------------
# Its rule per step, over the raw series or the recording rules (:class:`~gpuscope.dashboard.
# data.recorded.Steps`): dashboard/plan/ sends it, the gpuscope-dashboard rules record it.


def throttling_promql(st: Steps, over: str | None = None) -> str:
    """Each device's throttle seconds per second by reason where above 0 (any reason,
    any amount: a straggler's evidence, not a verdict), over ``over`` (default: the
    step's rate range); each exporter pod's, summed (:func:`~gpuscope.dashboard.data.
    promql.summed_rate`: a rollout)."""
    return (f"{summed_rate(st.sel('gpu_throttle_seconds_total'), over or st.rr, f'{GBY}, reason')}"
            f" > 0")


def candidate_promql(st: Steps, th: Thresholds) -> list[str]:
    """The workloads (``namespace, workload``, ``kind`` ``stalled`` or ``slow``) that
    may hold a straggler at a step: supersets of the rules of
    :mod:`..analysis.stragglers`, which the analysis applies to the history. A device of
    a workload is the summed utilization of the workload's containers on it. Stalled: a
    device below ``straggler_factor`` x the workload's highest (the median is at most
    that). Slow: every device busy, and the highest SM activity (else power)
    ``slow_factor`` x the lowest or more (the median is at least the lowest), each
    within a group (a workload's devices of one model, as the rule judges them: a workload
    whose A100s are busy beside its idle L4s can hold a slow A100), the groups counted by
    workload."""
    per = "by (namespace, workload)"
    devw = st.workload()
    stalled = (f"count {per} ({devw} < on (namespace, workload) group_left ()"
               f" ({th.straggler_factor!r} * max {per} ({devw})))")
    work = f"({st.active('sm')} or on (node, uuid) {st.power()})"
    devm = st.workload(model=True)
    grp = f"by ({GROUP})"
    xw = f"({devm} * 0 + on (node, uuid) group_left () {work})"
    uw = f"({devm} * 0 + on (node, uuid) group_left () {st.util()})"
    slow = (f"count {per} (count {grp} ({xw}) >= 2 and on ({GROUP})"
            f" (max {grp} ({xw}) >= {th.slow_factor!r} * min {grp} ({xw}))"
            f" and on ({GROUP}) (min {grp} ({uw}) >= {th.slow_busy!r}))")
    return [f'label_replace({stalled}, "kind", "stalled", "", "")',
            f'label_replace({slow}, "kind", "slow", "", "")']


def candidates_promql(st: Steps, th: Thresholds) -> str:
    """:func:`candidate_promql` as one expression."""
    return " or ".join(candidate_promql(st, th))

# The stragglers' rules themselves, per minute (recorded: :func:`recording_rules`), as
# :mod:`..analysis.stragglers` applies them to each step: a group is a workload's
# devices of one GPU model (``model`` from ``gpu_info``, "" where a device has none);
# a device, the summed utilization of the workload's containers on it (recorded with
# its model: ``Steps.workload(model=True)``); the median over
# the group's devices present in that minute (``quantile(0.5)`` interpolates as
# ``statistics.median`` does: the mean of the middle two of an even count).


def stalled_median_promql(st: Steps) -> str:
    """Each group's median utilization, where it has two devices or more."""
    dev = st.workload(model=True)
    return (f"quantile by ({GROUP}) (0.5, {dev})"
            f" and on ({GROUP}) (count by ({GROUP}) ({dev}) >= 2)")


def stalled_promql(st: Steps, th: Thresholds) -> str:
    """The devices below ``straggler_factor`` x their group's median (value: the
    device's utilization); reads the recorded median."""
    median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['stalled_median'])}[{st.r}]))"
    return (f"{st.workload(model=True)} < on ({GROUP}) group_left ()"
            f" ({th.straggler_factor!r} * {median})")


def group_work_promql(st: Steps) -> str:
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


def _recorded_work(st: Steps) -> str:
    by = f"{MEMBER}, signal"
    return f"max by ({by}) (avg_over_time({st.sel(RULES['group_work'])}[{st.r}]))"


def work_median_promql(st: Steps, th: Thresholds) -> str:
    """Each group's median work (:meth:`group_work`, recorded, label ``signal``) where
    the slow-rank rule can apply: two devices or more, every one busy (utilization >=
    ``slow_busy``) and with its work signal, and the median above 0."""
    dev, work = st.workload(model=True), _recorded_work(st)
    n = f"count by ({GROUP}) ({dev})"
    busy = (f"count by ({GROUP}) (({dev} * 0 + on (node, uuid) group_left () {st.util()})"
            f" >= {th.slow_busy!r})")
    return (f"(quantile by ({GROUP}, signal) (0.5, {work}) > 0)"
            f" and on ({GROUP}) ({n} >= 2)"
            f" and on ({GROUP}) ({busy} == on ({GROUP}) {n})"
            f" and on ({GROUP}) (count by ({GROUP}) ({work}) == on ({GROUP}) {n})")


def slow_promql(st: Steps, th: Thresholds) -> str:
    """The devices at ``slow_factor`` x their group's median work or more (value: the
    device's work, label ``signal``); reads the recorded median."""
    median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['work_median'])}[{st.r}]))"
    return (f"{_recorded_work(st)} >= on ({GROUP}) group_left ()"
            f" ({th.slow_factor!r} * {median})")


def straggler_runs_promql(hist: History) -> dict[str, str]:
    """With the recording rules: each straggler whose rule held at every step of the
    history with its mean (``stalled``, ``slow``), and its group's median's mean over the
    same steps (``stalled_median``, ``slow_median``: the median is there at each of them,
    the rule compares with it)."""
    out = {}
    for kind, median, by in (("stalled", "stalled_median", MEMBER),
                             ("slow", "work_median", f"{MEMBER}, signal")):
        runs = hist.whole(kind, by)
        out[kind] = f"{hist.mean(kind, by)} and on ({by}) {runs}"
        out[f"{kind}_median"] = (f"{hist.mean(median, f'{GROUP}, signal')}"
                                 f" and on ({GROUP}) {hist.whole(median, GROUP)}"
                                 f" and on ({GROUP}) {runs}")
    return out


def run_rules() -> tuple[RunRule, RunRule]:
    """The recording-rule forms of the stalled and slow stragglers' runs (:mod:`.runs`):
    each device's run, and over it the sums of its value (utilization; work) and of its
    group's median, the table's two means. A run that begins with the device's workload
    series (its group work) gets the history's benefit on the page."""
    out = []
    for kind, by, median, data in (
            ("stalled", MEMBER, recorded("stalled_median", GROUP), "workload"),
            ("slow", f"{MEMBER}, signal", recorded("work_median", f"{GROUP}, signal"),
             "group_work")):
        flag = recorded(kind, by)
        on = GROUP if kind == "stalled" else f"{GROUP}, signal"
        out.append(RunRule(
            f"{kind}_run", by, flag, recorded(data, by),
            {"value": flag(""),
             "median": f"({flag('')} * 0 + on ({on}) group_left () {median('')})"}))
    return out[0], out[1]


def straggler_of(group: Group, gpu: GpuRef, run: RecordedRun, window: Window,
                 history_start: float, *, kind: str, signal: str = "utilization",
                 duration: float = STRAGGLER_DURATION) -> Straggler | None:
    """A device's straggler finding from its recorded run (:func:`run_rules`; ``kind``
    ``stalled`` or ``slow``) in ``group`` (its pods, its size), where it has held long
    enough: its value's and its group median's means over the run's minutes within the
    history."""
    required = required_seconds(duration, window, history_start)
    r = run.on_page(window, history_start)
    value, median = run.mean("value", history_start), run.mean("median", history_start)
    if not holds(r, required) or value is None or median is None:
        return None
    cluster, namespace, workload, model = group.key
    return Straggler(namespace=namespace, workload=workload, gpu=gpu,
                     pods=group.pods.get(gpu, ()), value=value, median=median, since=r.start,
                     seconds=r.seconds, required_seconds=required, devices=len(group.devices),
                     kind=kind, signal=signal, model=model, cluster=cluster)


def group_gpus_promql(span: str) -> str:
    """The rule ``workload:gpu_straggler_group_gpus:sum1h``: per straggler group (a
    workload's devices of one model) with a stalled or slow device in the minute, its
    devices on each node that its containers used over ``span`` (the default page's hour;
    ``uuid:gpu_workload_utilization:sum1m``, :func:`workload_groups`' devices), in whole
    GPUs (a MIG slice its share of its GPU, :func:`~.mig.slice_share_promql`): what the
    group's row prices ("GPUs' $/hour": the node's $/hour a GPU times these), from a few
    series a group instead of its containers'."""
    flagged = " or ".join(
        f"count by ({GROUP}) (last_over_time({RULES[kind]}[{RULE_R}]))"
        for kind in ("stalled", "slow"))
    mine = (f"(max by ({MEMBER}) (max_over_time({RULES['workload']}[{span}]))"
            f" and on ({GROUP}) ({flagged}))")
    known = f"max by (node, uuid, parent_uuid) (last_over_time({RULES['mig_slices']}[{RULE_R}]))"
    share = f"{mine} * 0 + on (node, uuid) group_left () {slice_share_promql(known)}"
    return f"sum by ({GROUP}, node) (({share}) or ({mine} * 0 + 1))"
