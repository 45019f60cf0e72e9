"""Allocated-idle containers, on every node: who holds a GPU or MIG slice and does not use it.

A container is allocated-idle when, at every step for >= ``duration`` (30 min, shortened to
the window and the history collected), it held the device (``container_gpu_allocated``) and
used less than ``threshold`` (0.05) of it, measured by (:func:`held_usage`):

- ``sm``: the device's SM activity, where the device has GPM and the container is its only
  holder (GPM measures the device, not a container);
- ``utilization``: else the container's own utilization (the highest sample in the step),
  as a share of what it holds: a time-slice of a GPU shared by n holders is 1/n of it, so a
  container that gets 3 % of a GPU it shares with two others uses 9 % of its part (it is
  starved, not idle; :mod:`.starvation` says so);
- ``process``: else, on a MIG slice without GPM (no utilization at all), whether it had a
  process there: 1 when its processes held memory on the slice in the step, 0 when none ran.

Host processes (empty namespace) hold nothing and are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.dashboard import ids
from gpuscope.dashboard.data.recorded import CBY, NOT_EMPTY, RULE_R, RULES, History, Steps
from gpuscope.dashboard.links import at_node, node_link, pod_link, workload_link
from gpuscope.dashboard.series import ContainerRef, GpuRef, Runs, Series, Window
from gpuscope.dashboard.verdicts.cells import for_cell, signal_cell
from gpuscope.dashboard.verdicts.common import (
    holds,
    is_fresh,
    required_seconds,
    runs_from,
    trailing_run,
)
from gpuscope.dashboard.verdicts.mig import slice_share_promql
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table, Threshold
from gpuscope.dashboard.verdicts.runs import RecordedRun, RunRule, recorded

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.verdicts.page import PageContext

ALLOCATED_IDLE_THRESHOLD = 0.05
ALLOCATED_IDLE_DURATION = 30 * 60.0

THRESHOLDS = (
    Threshold("allocated_idle_utilization", "ratio",
              "a container holding a GPU, slice or time-slice is allocated-idle using less "
              "than this share of it"),
    Threshold("allocated_idle_duration", "seconds", "... for at least this long"),
)


@dataclass(frozen=True, slots=True)
class AllocatedIdle:
    """``usage``: mean over the idle run, by ``signal``."""

    ref: ContainerRef
    signal: str
    usage: float
    since: float
    seconds: float
    required_seconds: float
    history_seconds: float


def held_usage(
    held: Mapping[ContainerRef, Series],
    container_util: Mapping[ContainerRef, Series],
    container_memory: Mapping[ContainerRef, Series],
    device_sm: Mapping[GpuRef, Series],
    gpm: Collection[GpuRef],
    slices: Collection[GpuRef],
) -> tuple[dict[ContainerRef, Series], dict[ContainerRef, str]]:
    """Per container, per step in which it held its device: how much it used, and by which
    signal (that of its latest step). All series share one step grid.

    ``held``: per step, > 0 where the container held the device; ``container_util``: per
    step, the container's highest utilization sample; ``container_memory``: per step, its
    processes' memory on the device; ``device_sm``: per step, the device's SM activity;
    ``gpm``: devices with GPM; ``slices``: the MIG slices."""
    holders: dict[GpuRef, dict[float, int]] = {}
    held_at: dict[ContainerRef, list[float]] = {}
    for ref, series in held.items():
        if not ref.namespace:
            continue
        times = [t for t, v in zip(series.times, series.values, strict=True) if v > 0]
        held_at[ref] = times
        count = holders.setdefault(ref.gpu, {})
        for t in times:
            count[t] = count.get(t, 0) + 1
    usage: dict[ContainerRef, Series] = {}
    signal: dict[ContainerRef, str] = {}
    for ref, times in held_at.items():
        sm = device_sm[ref.gpu].at() if ref.gpu in device_sm else {}
        util = container_util[ref].at() if ref in container_util else {}
        memory = container_memory[ref].at() if ref in container_memory else {}
        gpm_device = ref.gpu in gpm
        out_t: list[float] = []
        out_v: list[float] = []
        last = ""
        for t in times:
            if gpm_device and holders[ref.gpu].get(t) == 1 and t in sm:
                value, last = sm[t], "sm"
            elif t in util:
                value, last = util[t] * max(1, holders[ref.gpu].get(t, 1)), "utilization"
            elif ref.gpu in slices and not gpm_device and t in memory:
                value, last = (1.0 if memory[t] > 0 else 0.0), "process"
            else:
                continue
            out_t.append(t)
            out_v.append(value)
        if out_t:
            usage[ref] = Series(tuple(out_t), tuple(out_v))
            signal[ref] = last
    return usage, signal


def allocated_idle(
    usage: Mapping[ContainerRef, Series],
    signal: Mapping[ContainerRef, str],
    window: Window,
    history_start: float,
    *,
    runs: Runs | None = None,
    threshold: float = ALLOCATED_IDLE_THRESHOLD,
    duration: float = ALLOCATED_IDLE_DURATION,
) -> list[AllocatedIdle]:
    """The containers whose held device has gone unused for long enough. ``usage`` may
    leave out steps at or above the threshold (a missing step breaks a run). ``runs``: the
    containers the store found allocated-idle at every step of the history, with their
    signal and mean use (:class:`~..series.Runs`), where ``usage`` has no steps of them."""
    required = required_seconds(duration, window, history_start)
    history = max(0.0, window.end - history_start)
    out: list[AllocatedIdle] = []
    if runs is not None and runs.held_idle:
        # The store's runs share a few runs (the history's, and those from a later step),
        # each judged once, as its steps (from the run's first, alone) would give it.
        run_from = runs_from(runs.steps, window, history_start)
        for ref, (sig, mean) in runs.held_idle.items():
            if not ref.namespace or ref in usage:
                continue
            run = run_from(runs.held_idle_from.get(ref, 0))
            if run is not None and holds(run, required):
                out.append(AllocatedIdle(ref, sig, mean, run.start, run.seconds, required,
                                         history))
    for ref, series in usage.items():
        if not ref.namespace or not is_fresh(series.times, window):
            continue
        flags = [v < threshold for v in series.values]
        run = trailing_run(series.times, flags, window.step, history_start)
        if run is None or not holds(run, required):
            continue
        values = series.values[run.first_index:]
        out.append(AllocatedIdle(ref, signal.get(ref, "utilization"),
                                 sum(values) / len(values), run.start, run.seconds, required,
                                 history))
    out.sort(key=lambda a: (a.ref.node, a.ref.namespace, a.ref.pod, a.ref.container, a.ref.uuid))
    return out


# -- on the page -----------------------------------------------------------------------------

ALLOCATED_COLUMNS = (
    Column("namespace", "Namespace"),
    Column("pod", "Pod", "link"),
    Column("container", "Container"),
    Column("workload", "Workload", "link"),
    Column("node", "Node", "link"),
    Column("holds", "Holds"),
    Column("usage", "Uses", "percent"),
    Column("for", "Idle for"),
    Column("price", "$/hour", "money"),
    Column("signal", "Judged by"),
)
SECTION = Section(
    id=ids.SECTION_ALLOCATED, title="Allocated but idle",
    intro="Containers on any node that hold a GPU, a MIG slice or a time-slice of a GPU and "
          "have used almost none of it for the required time, with what they hold and what "
          "that costs: the list to act on.",
    tables=(Table(ids.ALLOCATED_IDLE_TABLE, ids.ALLOCATED_IDLE_NOTE, ALLOCATED_COLUMNS,
                  order="price"),),
)

# -- its findings as table rows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocatedIdleRow:
    """A container that holds a GPU, a MIG slice or a time-slice of a GPU and does not use
    it; ``price_per_hour`` is its share of its node's price."""

    namespace: str
    pod: str
    container: str
    workload: str
    node: str
    gpu: str
    holds: str
    signal: str
    usage: float
    since: float
    seconds: float
    required_seconds: float
    history_seconds: float
    price_per_hour: float | None
    price_basis: str



def allocated_rows(found: Iterable[AllocatedIdle], ctx: PageContext,
                   workload_of: Mapping[tuple[str, str, str], str],
                   holding: Callable[[ContainerRef], tuple[str, float | None]],
                   ) -> tuple[AllocatedIdleRow, ...]:
    """The allocated-idle table's rows, dearest first: each finding of ``found`` the page
    shows (``ctx``'s namespace), with its workload (``workload_of``: by node, namespace and
    pod) and what it holds with its $/hour (``holding``)."""
    rows = []
    for a in found:
        if not ctx.wanted(a.ref.namespace):
            continue
        holds, price = holding(a.ref)
        rows.append(AllocatedIdleRow(
            namespace=a.ref.namespace, pod=a.ref.pod, container=a.ref.container,
            workload=workload_of.get((a.ref.node, a.ref.namespace, a.ref.pod), ""),
            node=a.ref.node, gpu=ctx.index(a.ref.gpu), holds=holds, signal=a.signal,
            usage=a.usage, since=a.since, seconds=a.seconds,
            required_seconds=a.required_seconds, history_seconds=a.history_seconds,
            price_per_hour=price, price_basis=ctx.basis(a.ref.node),
        ))
    rows.sort(key=lambda r: (-(r.price_per_hour or 0.0), r.namespace, r.pod))
    return tuple(rows)


def allocated_data(rows: Sequence[AllocatedIdleRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "namespace": r.namespace, "pod": pod_link(r.namespace, r.pod, at_node(state, r.node)),
            "container": r.container,
            # A pod no controller owns: said, as the cost-by-owner table says "(bare pods)".
            "workload": workload_link(r.namespace, r.workload, at_node(state, r.node))
            or "(bare pod)",
            "node": node_link(r.node, state), "holds": r.holds, "usage": r.usage,
            "for": for_cell(r.seconds, r.required_seconds), "price": r.price_per_hour,
            "signal": signal_cell(r.signal, r.price_basis),
        }
        for r in rows
    ]


# -- as PromQL --------------------------------------------------------------------------------
# Its rule per step, over the raw series or the recording rules (:class:`~gpuscope.dashboard.
# data.recorded.Steps`): dashboard/plan/ sends it, the gpuscope-dashboard rules record it.


def held_idle_promql(st: Steps, th: Thresholds) -> list[str]:
    """Per container, what it uses of what it holds where that is below the idle
    threshold: the device's SM activity where it has GPM and one holder, else the
    container's utilization times the device's holders (its share of a time-sliced GPU),
    else (a MIG slice without GPM) 0 while it has no process there."""
    r = st.r
    idle = f"{th.idle_utilization!r}"
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


def held_idle_runs_promql(hist: History) -> str:
    """With the recording rules: the containers allocated-idle at every minute of the
    history (on one-minute steps: at the end, a run where :func:`held_idle_minutes_promql`
    says how long it is), with their mean use over the history's allocated-idle minutes
    (the sparse series has no other), by signal."""
    by = f"{CBY}, signal"
    return f"{hist.mean('held_idle', by)} and on ({by}) {hist.held('held_idle', by)}"


def held_idle_minutes_promql(hist: History) -> str:
    """With the recording rules: how many minutes each container allocated-idle at the end
    has been without a gap (from its first in the history, :meth:`~..data.recorded.History.
    run`), by signal: the run :func:`held_idle_runs_promql`'s mean is over."""
    return hist.run("held_idle", f"{CBY}, signal")


def run_rule() -> RunRule:
    """The recording-rule form of the allocated-idle containers' runs (:mod:`.runs`): each
    container's run of ``container:gpu_held_idle_usage:ratio1m`` and the sum of its use over
    the run (the table's mean); a run that begins with its holding
    (``container:gpu_held_share:max1m``) gets the history's benefit on the page."""
    flag = recorded("held_idle", CBY)
    return RunRule("alloc_run", CBY, flag, recorded("held_share", CBY), {"usage": flag("")})


def allocated_idle_of(ref: ContainerRef, run: RecordedRun, window: Window,
                      history_start: float, *, signal: str = "utilization",
                      duration: float = ALLOCATED_IDLE_DURATION) -> AllocatedIdle | None:
    """The container's finding from its recorded run (:func:`run_rule`), where it has held
    long enough: its mean use over the run's minutes within the history."""
    required = required_seconds(duration, window, history_start)
    r, mean = run.on_page(window, history_start), run.mean("usage", history_start)
    if not holds(r, required) or mean is None:
        return None
    return AllocatedIdle(ref, signal, mean, r.start, r.seconds, required,
                         max(0.0, window.end - history_start))


def share_promql(span: str) -> str:
    """The rule ``container:gpu_allocated_idle_share:ratio1h``: each container
    allocated-idle in the minute, its share of its GPU's price as its row prices it (the
    views' ``holding``): a MIG slice's share of its GPU (:func:`~.mig.slice_share_promql`
    on ``uuid:gpu_mig_compute_slices:count``), else 1 / the device's users over ``span``
    (containers with a mean over the hour, or held idle in it: a time-slice)."""
    known = f"max by (node, uuid, parent_uuid) (last_over_time({RULES['mig_slices']}[{RULE_R}]))"
    # (The page counts the holders with a use of the device: on a whole GPU, those with a
    # utilization series, which have a mean; the allocated-idle flag over the hour adds
    # any other, at a tenth of the cost of every holder's share over it.)
    users = (f"count by (node, uuid) (max by ({CBY}) (last_over_time({RULES['cmean']}"
             f"[{RULE_R}])) or max by ({CBY}) (max_over_time({RULES['held_idle']}[{span}])))")
    device = f"({slice_share_promql(known)} or on (node, uuid) (1 / {users}))"
    return (f"max by ({CBY}) (last_over_time({RULES['held_idle']}[{RULE_R}])) * 0"
            f" + on (node, uuid) group_left () {device}")
