"""Idle GPUs and idle nodes.

- idle GPU: utilization < ``threshold`` (0.05) for >= ``duration`` (30 min), the duration
  shortened to the window and to the history collected (see :mod:`.common`). Judged on the
  per-step *maximum*, so a single busy sample inside a step makes the step busy. A step in
  which the GPU *spins* (:mod:`.spinning`: busy by utilization, doing no work) counts as an
  idle step: a hung job holds a node at "100 %" and does nothing.
- idle MIG slice: its SM activity < ``threshold`` (GPM), else its utilization where it
  reports one, else no process held memory on it, for the same duration (the data layer
  gives each slice's per-step activity and says which signal it is).
- idle node: every whole GPU on it is idle; a GPU in MIG mode is idle when every one of its
  slices is, and one with no slice (:func:`uncarved_promql`: it can run nothing) is idle
  at the steps it is so (the data layer gives it 0 there, signal ``mig``). A GPU that
  reports nothing to judge it by (lost, not supported) cannot be shown idle, so its node
  is not idle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.dashboard import fmt, ids
from gpuscope.dashboard.data.recorded import (
    GBY,
    NOT_EMPTY,
    RULE_INTERVAL,
    RULE_R,
    RULES,
    History,
    Steps,
)
from gpuscope.dashboard.links import node_link
from gpuscope.dashboard.series import GpuInfo, GpuRef, NodeInfo, Runs, Series, Window
from gpuscope.dashboard.verdicts.cells import SIGNALS, for_cell, since_cell
from gpuscope.dashboard.verdicts.common import (
    Run,
    holds,
    is_fresh,
    required_seconds,
    runs_from,
    tails_from,
    trailing_run,
)
from gpuscope.dashboard.verdicts.mig import Fleet, fleet_of
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table, Threshold
from gpuscope.dashboard.verdicts.runs import RecordedRun, RunRule, either, recorded

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.verdicts.page import PageContext
    from gpuscope.dashboard.verdicts.waste import WasteReport

IDLE_THRESHOLD = 0.05
IDLE_DURATION = 30 * 60.0

THRESHOLDS = (
    Threshold("idle_utilization", "ratio",
              "a GPU (or MIG slice) is idle below this utilization (SM activity on a "
              "slice with GPM)"),
    Threshold("idle_duration", "seconds", "... for at least this long"),
)


@dataclass(frozen=True, slots=True)
class GpuIdle:
    """The idle verdict of one device.

    ``idle_since``/``idle_seconds``: the trailing run below the threshold (None/0 when the
    latest step is busy); ``allocated_seconds``: the part of that run in which a container
    held the device; ``spinning_seconds``: the part in which it spun; ``required_seconds``:
    how long it had to be idle (min(D, window, history)); ``history_seconds``: the history
    the verdict rests on; ``signal``: what it was judged by (``utilization``, ``sm``,
    ``process``).
    """

    ref: GpuRef
    idle: bool
    idle_since: float | None
    idle_seconds: float
    allocated_seconds: float
    required_seconds: float
    history_seconds: float
    has_data: bool = True
    spinning_seconds: float = 0.0
    signal: str = "utilization"

    @property
    def unallocated_seconds(self) -> float:
        return max(0.0, self.idle_seconds - self.allocated_seconds)


def idle_gpus(
    busy_max: Mapping[GpuRef, Series],
    window: Window,
    history_start: float,
    *,
    allocated: Mapping[GpuRef, Series] | None = None,
    spinning: Mapping[GpuRef, Collection[float]] | None = None,
    signal: Mapping[GpuRef, str] | None = None,
    known_from: Mapping[GpuRef, float] | None = None,
    runs: Runs | None = None,
    threshold: float = IDLE_THRESHOLD,
    duration: float = IDLE_DURATION,
) -> dict[GpuRef, GpuIdle]:
    """Verdict for every device with activity data.

    ``allocated`` (per step, a value > 0 where a container held the device) splits each idle
    run into allocated-idle and unallocated time; ``spinning`` (per device, the times of its
    spinning steps) makes those steps idle; ``signal`` names each device's activity signal;
    ``known_from`` (per spinning device, :func:`~.spinning.spin_begins`) is where the
    spinning rule can first judge it: a busy step before it is unknown and left out, as the
    spinning verdict leaves it out, so that a device spinning for the required time is idle
    for it too. ``runs``: what the store summarised whole (:class:`~..series.Runs`): a
    device idle at every step of the history, or held at every one, where it sent no steps
    of its own for it.
    """
    required = required_seconds(duration, window, history_start)
    history = max(0.0, window.end - history_start)
    spinning = spinning or {}
    signal = signal or {}
    whole = runs.idle if runs is not None else {}
    since = runs.idle_from if runs is not None else {}
    steps = runs.steps if runs is not None else ()
    whole_held = runs.held if runs is not None else frozenset()
    # The store's runs share a few runs, the history's and those from a later step: each
    # judged once, each device then in O(1) below, as its steps (those from the run's
    # first, sent alone: nothing before it) would give it.
    run_from = runs_from(steps, window, history_start)
    steps_from = tails_from(steps)
    whole_steps = steps_from(0)
    spun_from = runs.spinning_from if runs is not None else {}

    first = steps[0] if steps else None
    out: dict[GpuRef, GpuIdle] = {}
    for ref in set(busy_max) | set(spinning) | set(whole):
        series = busy_max.get(ref)
        spins = spinning.get(ref, ())
        sig = signal.get(ref) or whole.get(ref, "utilization")
        k = since.get(ref, 0) if ref in whole else spun_from.get(ref, 0)
        done = (run_from(k) if runs is not None and series is None
                and (allocated is None or ref not in allocated)
                and ((ref in whole and not spins)
                     or (ref not in whole and spins == steps_from(k)
                         and (known_from is None or known_from.get(ref) in (None, first))))
                else None)
        if done is not None:
            # Idle, or spinning, at every step of the history (or at every one from a later
            # step), by the store's summary: its run, as the steps below would give
            # it: their held and spinning shares are ``seconds * n / steps``, here
            # n == steps, kept as written so the floats are the steps' to the bit.
            n_run = len(steps) - k - done.first_index
            held_s = done.seconds * n_run / n_run if ref in whole_held else 0.0
            spin_s = done.seconds * n_run / n_run if spins else 0.0
            out[ref] = GpuIdle(ref, holds(done, required), done.start, done.seconds,
                               held_s, required, history, spinning_seconds=spin_s,
                               signal=sig)
            continue
        if spins or series is None:
            if series is not None:
                below = {t for t, v in zip(series.times, series.values, strict=True)
                         if v < threshold}
                known = set(series.times)
            else:  # idle at every step of its run, or no step but spinning ones
                below = set(steps[since.get(ref, 0):]) if ref in whole else set()
                known = below
            times = sorted(known | set(spins))
            begins = known_from.get(ref) if known_from is not None else None
            if begins is not None:
                times = [t for t in times if t >= begins or t in below]
            flags = [t in below or t in spins for t in times]
        else:
            # No spinning step (most devices): the series' own times (increasing) and
            # values, without the sets (a fleet page judges 10^4 devices here).
            below = set()
            times = list(series.times)
            flags = [v < threshold for v in series.values]
        if not is_fresh(times, window):
            out[ref] = GpuIdle(ref, False, None, 0.0, 0.0, required, history, has_data=False,
                               signal=sig)
            continue
        run = trailing_run(times, flags, window.step, history_start)
        if run is None:
            out[ref] = GpuIdle(ref, False, None, 0.0, 0.0, required, history, signal=sig)
            continue
        run_times = times[run.first_index:]
        held = allocated.get(ref) if allocated is not None else None
        allocated_s = 0.0
        if held is not None or ref in whole_held:
            holding = (whole_steps if held is None else
                       {t for t, v in zip(held.times, held.values, strict=True) if v > 0})
            n_held = sum(1 for t in run_times if t in holding)
            allocated_s = run.seconds * n_held / len(run_times)
        n_spin = (sum(1 for t in run_times if t in spins and t not in below) if spins
                  else 0)
        out[ref] = GpuIdle(
            ref, holds(run, required), run.start, run.seconds, allocated_s, required, history,
            spinning_seconds=run.seconds * n_spin / len(run_times), signal=sig,
        )
    return out


@dataclass(frozen=True, slots=True)
class NodeIdle:
    """A node all of whose GPUs are idle. ``idle_since`` is when the last of them went idle;
    the GPU-seconds are summed over its GPUs' own idle runs, a MIG slice's weighted by its
    share of its GPU, and a MIG GPU's compute slices that no slice covers counted for the
    run of the GPU (unallocated) (so they are whole-GPU seconds). ``spinning_gpus`` counts
    the GPUs that spun in their idle run, ``mig_gpus`` the GPUs in MIG mode."""

    node: str
    gpus: int
    idle_since: float
    idle_gpu_seconds: float
    allocated_gpu_seconds: float
    allocated_gpus: int
    required_seconds: float
    history_seconds: float
    spinning_gpu_seconds: float = 0.0
    spinning_gpus: int = 0
    mig_gpus: int = 0

    @property
    def unallocated_gpu_seconds(self) -> float:
        return max(0.0, self.idle_gpu_seconds - self.allocated_gpu_seconds)


@dataclass(frozen=True, slots=True)
class _Part:
    """One idle device's contribution to its node, in whole-GPU units."""

    since: float
    seconds: float
    allocated: float
    spinning: float
    required: float
    history: float


def _gpu_part(
    info: GpuInfo,
    verdicts: Mapping[GpuRef, GpuIdle],
    slices: Mapping[GpuRef, list[GpuInfo]],
    shares: Mapping[GpuRef, float],
) -> _Part | None:
    """A whole GPU's idle contribution, or None when it is not idle (or cannot be shown
    idle). A GPU in MIG mode is idle when each of its slices is."""
    parts = slices.get(info.ref)
    if parts:
        found = [verdicts.get(s.ref) for s in parts]
        if any(v is None or not v.idle for v in found):
            return None
        idle = [(v, shares.get(s.ref, 0.0)) for v, s in zip(found, parts, strict=True)
                if v is not None]
        # Compute slices no slice covers (never carved) are idle with the GPU, held by
        # nobody: the GPU's idle time is whole-GPU time however it is carved.
        uncarved = max(0.0, 1.0 - sum(w for _, w in idle))
        return _Part(
            since=max(v.idle_since or 0.0 for v, _ in idle),
            seconds=(sum(v.idle_seconds * w for v, w in idle)
                     + uncarved * min(v.idle_seconds for v, _ in idle)),
            allocated=sum(v.allocated_seconds * w for v, w in idle),
            spinning=0.0,
            required=idle[0][0].required_seconds,
            history=idle[0][0].history_seconds,
        )
    v = verdicts.get(info.ref)
    if v is None or not v.idle:
        return None
    return _Part(v.idle_since or 0.0, v.idle_seconds, v.allocated_seconds, v.spinning_seconds,
                 v.required_seconds, v.history_seconds)


def gpu_states(
    gpus: Mapping[GpuRef, GpuInfo],
    verdicts: Mapping[GpuRef, GpuIdle],
    spinning: Collection[GpuRef] = (),
    reporting: Collection[GpuRef] = (),
    *,
    fleet: Fleet | None = None,
) -> dict[GpuRef, str]:
    """What each whole GPU is: ``spinning``, ``idle``, ``busy`` or ``no data`` (nothing to
    judge it by: lost, not supported, or in MIG mode with no slice reporting). ``reporting``:
    devices with data now besides those with an idle verdict (the Prometheus mode sends
    only idle steps). ``fleet``: :func:`fleet_of` ``gpus``, when the caller has it."""
    fleet = fleet or fleet_of(gpus)
    slices, shares = fleet.slices, fleet.shares
    out: dict[GpuRef, str] = {}
    for infos in fleet.by_node.values():
        for info in infos:
            ref = info.ref
            parts = slices.get(ref)
            if not parts:  # a GPU not in MIG mode (most): its own verdict alone
                v = verdicts.get(ref)
                out[ref] = ("spinning" if ref in spinning else
                            "no data" if (v is None or not v.has_data) and ref not in reporting
                            else "idle" if v is not None and v.idle else "busy")
                continue
            refs = [s.ref for s in parts]
            found = [verdicts.get(r) for r in refs]
            if info.ref in spinning:
                out[info.ref] = "spinning"
            elif not any(v is not None and v.has_data for v in found) and not any(
                    r in reporting for r in refs):
                out[info.ref] = "no data"
            elif _gpu_part(info, verdicts, slices, shares) is not None:
                out[info.ref] = "idle"
            else:
                out[info.ref] = "busy"
    return out


def idle_nodes(
    gpus: Mapping[GpuRef, GpuInfo], verdicts: Mapping[GpuRef, GpuIdle], *,
    fleet: Fleet | None = None,
) -> dict[str, NodeIdle]:
    """Nodes whose every whole GPU is idle (a GPU in MIG mode: every slice)."""
    fleet = fleet or fleet_of(gpus)
    slices, shares = fleet.slices, fleet.shares
    out: dict[str, NodeIdle] = {}
    for node, infos in fleet.by_node.items():
        # Most nodes have a busy GPU: the first one not idle ends the node's test.
        idle: list[_Part] = []
        for info in infos:
            part = _gpu_part(info, verdicts, slices, shares)
            if part is None:
                break
            idle.append(part)
        if not idle or len(idle) < fleet.gpus_on(node):
            continue
        out[node] = NodeIdle(
            node=node,
            gpus=len(idle),
            idle_since=max(p.since for p in idle),
            idle_gpu_seconds=sum(p.seconds for p in idle),
            allocated_gpu_seconds=sum(p.allocated for p in idle),
            allocated_gpus=sum(1 for p in idle if p.allocated > 0),
            required_seconds=idle[0].required,
            history_seconds=idle[0].history,
            spinning_gpu_seconds=sum(p.spinning for p in idle),
            spinning_gpus=sum(1 for p in idle if p.spinning > 0),
            mig_gpus=sum(1 for info in infos if info.ref in slices),
        )
    return out


@dataclass(frozen=True, slots=True)
class SliceIdle:
    """An idle MIG slice on a node that is not idle: capacity of its own, paid for.
    ``share``: its share of its GPU's compute slices."""

    ref: GpuRef
    parent: GpuRef
    share: float
    verdict: GpuIdle


def idle_slices(
    gpus: Mapping[GpuRef, GpuInfo],
    verdicts: Mapping[GpuRef, GpuIdle],
    skip_nodes: Collection[str] = (),
    *,
    fleet: Fleet | None = None,
) -> list[SliceIdle]:
    """Idle MIG slices, except on ``skip_nodes`` (the idle nodes, whose waste has them)."""
    fleet = fleet or fleet_of(gpus)
    shares = fleet.shares
    out = []
    for parent, parts in fleet.slices.items():
        if parent.node in skip_nodes:
            continue
        for info in parts:
            v = verdicts.get(info.ref)
            if v is not None and v.idle:
                out.append(SliceIdle(info.ref, parent, shares.get(info.ref, 0.0), v))
    out.sort(key=lambda s: (s.ref.node, s.parent.uuid, s.ref.uuid))
    return out


# -- on the page -----------------------------------------------------------------------------

IDLE_COLUMNS = (
    Column("node", "Node", "link"),
    Column("instance_type", "Instance type"),
    Column("gpus", "GPUs", "count"),
    Column("idle_since", "Idle since (UTC)", csv="idle_since_csv"),
    Column("idle_for", "Idle for"),
    Column("price", "$/hour", "money"),
    Column("price_basis", "Priced"),
    Column("wasted", "$ wasted in window", "money"),
    Column("unallocated", "Unallocated GPUs", "count"),
    Column("wasted_unallocated", "$ unallocated", "money"),
    Column("allocated", "Allocated-idle GPUs", "count"),
    Column("wasted_allocated", "$ allocated-idle", "money"),
    Column("spinning", "Spinning GPUs", "count"),
    Column("evidence", "Evidence"),
)
SLICE_COLUMNS = (
    Column("node", "Node", "link"),
    Column("gpu", "MIG slice"),
    Column("profile", "Profile"),
    Column("share", "Share of its GPU", "percent"),
    Column("idle_for", "Idle for"),
    Column("held", "Held by a pod"),
    Column("price", "$/hour", "money"),
    Column("wasted", "$ wasted in window", "money"),
    Column("signal", "Judged by"),
)
SECTION = Section(
    id=ids.SECTION_IDLE, title="Idle nodes",
    intro="Nodes whose every GPU has been idle (utilization below the threshold) or spinning "
          "(busy by utilization, doing no work) for the required time, a GPU in MIG mode when "
          "each of its slices is; cost at the node's price (spot where your price file has "
          "one), split into GPUs no container holds (unallocated) and GPUs held but unused "
          "(allocated-idle).",
    tables=(Table(ids.IDLE_NODES_TABLE, ids.IDLE_NOTE, IDLE_COLUMNS, order="wasted"),
            Table(ids.IDLE_SLICES_TABLE, ids.IDLE_SLICES_NOTE, SLICE_COLUMNS,
                  heading="Idle MIG slices on busy nodes", order="price")),
    header_id=ids.WASTE_TOTAL,
)

# -- its findings as table rows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IdleRow:
    node: str
    instance_type: str
    gpus: int
    idle_since: float
    idle_seconds: float
    price_per_hour: float | None
    wasted: float | None
    wasted_unallocated: float | None
    wasted_allocated: float | None
    allocated_gpus: int
    required_seconds: float
    history_seconds: float
    spinning_gpus: int = 0
    mig_gpus: int = 0
    price_basis: str = "on-demand"

    @property
    def unallocated_gpus(self) -> int:
        return self.gpus - self.allocated_gpus


@dataclass(frozen=True, slots=True)
class SliceRow:
    """An idle MIG slice on a node that is busy otherwise."""

    node: str
    gpu: str
    profile: str
    share: float
    signal: str
    idle_since: float
    idle_seconds: float
    allocated: bool
    price_per_hour: float | None
    wasted: float | None
    required_seconds: float
    history_seconds: float


def idle_rows(report: WasteReport, ctx: PageContext,
              nodes: Mapping[str, NodeInfo]) -> tuple[IdleRow, ...]:
    """The idle-nodes table's rows: each idle node of the waste ``report`` (in its order),
    with its instance type (``nodes``) and how ``ctx`` prices it."""
    end = ctx.window.end
    return tuple(
        IdleRow(
            node=w.idle.node,
            instance_type=nodes[w.idle.node].instance_type if w.idle.node in nodes else "",
            gpus=w.idle.gpus,
            idle_since=w.idle.idle_since,
            idle_seconds=end - w.idle.idle_since,
            price_per_hour=w.price_per_hour,
            wasted=w.wasted,
            wasted_unallocated=w.wasted_unallocated,
            wasted_allocated=w.wasted_allocated,
            allocated_gpus=w.idle.allocated_gpus,
            required_seconds=w.idle.required_seconds,
            history_seconds=w.idle.history_seconds,
            spinning_gpus=w.idle.spinning_gpus,
            mig_gpus=w.idle.mig_gpus,
            price_basis=ctx.basis(w.idle.node),
        )
        for w in report.nodes
    )


def slice_rows(report: WasteReport, ctx: PageContext) -> tuple[SliceRow, ...]:
    """The idle MIG slices' rows, dearest first, from the waste ``report``."""
    end = ctx.window.end
    return tuple(
        SliceRow(
            node=s.slice.ref.node, gpu=ctx.index(s.slice.ref),
            profile=ctx.gpus[s.slice.ref].mig_profile if s.slice.ref in ctx.gpus else "",
            share=s.slice.share, signal=s.slice.verdict.signal,
            idle_since=s.slice.verdict.idle_since or end,
            idle_seconds=s.slice.verdict.idle_seconds, allocated=s.allocated,
            price_per_hour=s.price_per_hour, wasted=s.wasted,
            required_seconds=s.slice.verdict.required_seconds,
            history_seconds=s.slice.verdict.history_seconds,
        )
        for s in sorted(report.slices, key=lambda s: (-(s.price_per_hour or 0.0), s.slice.ref))
    )


def idle_data(rows: Sequence[IdleRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state),
            "instance_type": r.instance_type or "unknown",
            "gpus": r.gpus,
            "idle_since": since_cell(r.idle_since, r.idle_seconds, r.history_seconds),
            "idle_since_csv": since_cell(r.idle_since, r.idle_seconds, r.history_seconds,
                                         fmt.stamp),
            "idle_for": fmt.duration(r.idle_seconds),
            "price": r.price_per_hour,
            "price_basis": r.price_basis if r.price_per_hour is not None else "no price",
            "wasted": r.wasted,
            "unallocated": r.unallocated_gpus,
            "wasted_unallocated": r.wasted_unallocated,
            "allocated": r.allocated_gpus,
            "wasted_allocated": r.wasted_allocated,
            "spinning": r.spinning_gpus,
            "evidence": (f"needs {fmt.duration(r.required_seconds)}; history "
                         f"{fmt.duration(r.history_seconds)}"
                         + (f"; {r.mig_gpus} GPU(s) in MIG mode, judged by their slices"
                            if r.mig_gpus else "")
                         + ("; spinning GPUs count as idle: busy by utilization, no work"
                            if r.spinning_gpus else "")),
        }
        for r in rows
    ]


def slice_data(rows: Sequence[SliceRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state), "gpu": r.gpu, "profile": r.profile,
            "share": r.share, "idle_for": for_cell(r.idle_seconds, r.required_seconds),
            "held": "yes" if r.allocated else "no", "price": r.price_per_hour,
            "wasted": r.wasted, "signal": SIGNALS.get(r.signal, r.signal),
        }
        for r in rows
    ]


# -- as PromQL --------------------------------------------------------------------------------
# Its rule per step, over the raw series or the recording rules (:class:`~gpuscope.dashboard.
# data.recorded.Steps`): dashboard/plan/ sends it, the gpuscope-dashboard rules record it.


def idle_promql(st: Steps, th: Thresholds) -> list[str]:
    """Each device's idle activity below the threshold, labelled with its ``signal``:
    utilization (whole GPUs, slices that report it without GPM), ``mig``: 0 for a GPU in
    MIG mode with no slice (:func:`uncarved_promql`), SM activity (MIG slices with GPM),
    or (a MIG slice without either) 0 while no process holds memory on it. A device meets
    at most one of them. Which device is a slice, has GPM or reports utilization is read
    over the step (``max_over_time``), not as it stands at the step's end: a failed
    scrape's staleness marker hides every series there, and the slices had no idle step
    (their idle runs, and their nodes', began again)."""
    idle = f"{th.idle_utilization!r}"
    util = f"max_over_time({st.sel('gpu_utilization_ratio')}[{st.r}])"
    gpm = f"max_over_time({st.sel('gpu_sm_active_seconds_total')}[{st.r}])"
    slices = f"max_over_time({st.sel('gpu_info', {'parent_uuid': NOT_EMPTY})}[{st.r}])"
    cmem = st.sel("container_gpu_memory_used_bytes")
    memory = st.sel("gpu_memory_used_bytes")
    return [
        f'label_replace({st.util_max()} < {idle}'
        f' unless on (node, uuid) ({gpm} and on (node, uuid) {slices}),'
        f' "signal", "utilization", "", "")',
        f'label_replace({uncarved_promql(st)}, "signal", "mig", "", "")',
        f'label_replace({st.active("sm")} < {idle}'
        f' and on (node, uuid) {slices}, "signal", "sm", "", "")',
        f'label_replace(max by ({GBY}) (max_over_time({memory}[{st.r}]))'
        f' * 0 and on (node, uuid) {slices} unless on (node, uuid) {util}'
        f' unless on (node, uuid) {gpm}'
        f' unless on (node, uuid) (max by (node, uuid) (max_over_time({cmem}[{st.r}])) > 0),'
        f' "signal", "process", "", "")',
    ]


def uncarved_promql(st: Steps) -> str:
    """0 for each whole GPU in MIG mode (``gpu_sharing_info{sharing="mig"}``) with no MIG
    slice in the step (none in ``gpu_info`` with it as ``parent_uuid``) and no utilization
    of its own: it can run nothing (the MIG manager's layout not applied, or every slice
    destroyed), a whole GPU of idle time. A GPU in MIG mode with slices is judged by them."""
    mode = st.sel("gpu_sharing_info", {"sharing": '="mig"'})
    slices = f"max_over_time({st.sel('gpu_info', {'parent_uuid': NOT_EMPTY})}[{st.r}])"
    # (Not a slice itself: a slice's mode is its GPU's.)
    return (f"max by ({GBY}) (max_over_time({mode}[{st.r}])) * 0"
            f" unless on (node, uuid) {slices}"
            f" unless on (node, uuid) label_replace(max by (node, parent_uuid)"
            f' ({slices}), "uuid", "$1", "parent_uuid", "(.*)")'
            f" unless on (node, uuid) max_over_time({st.sel('gpu_utilization_ratio')}"
            f"[{st.r}])")


def silent_promql(st: Steps) -> str:
    """The devices with nothing to judge them by: no utilization sample, no SM activity
    (GPM) and not in MIG mode with no slice (:func:`uncarved_promql`) in the step. The
    devices are those of ``gpu_info`` over the step, not at its end, where a failed
    scrape's staleness marker hides it (the device read as having data)."""
    return (f"max by ({GBY}) (max_over_time({st.sel('gpu_info')}[{st.r}]))"
            f" unless on (node, uuid)"
            f" max_over_time({st.sel('gpu_utilization_ratio')}[{st.r}])"
            f" unless on (node, uuid) {st.active('sm')}"
            f" unless on (node, uuid) ({uncarved_promql(st)})")


def idle_now_promql(hist: History) -> str:
    """With the recording rules: the devices idle at the end (a sample in the last step,
    by the signal they were judged by; the first round's ``now``), each with how many of
    the history's recorded minutes it was idle in: where that is all of them, the run
    summary :func:`idle_runs_promql` gives (:attr:`~..series.Runs.idle`), so that the page
    need not ask it again."""
    by = f"{GBY}, signal"
    return f"{hist.minutes('idle', by)} and max by ({by}) ({hist.at_end('idle')})"


def idle_runs_promql(hist: History) -> str:
    """With the recording rules: the devices idle at the end whose idle minutes run without
    a gap from their first in the history to the end (:meth:`~..data.recorded.History.
    run`), by the signal they were judged by, with how many minutes
    (:attr:`~..series.Runs.idle`: every one of the history's, or
    :attr:`~..series.Runs.idle_from` a later one). A device that spun in the history is
    left out: a spinning step is idle for this verdict, so its steps say when its run
    began."""
    form = hist.run("idle", f"{GBY}, signal")
    if not hist.to_end:  # idle at every minute: it cannot have spun
        return form
    return f"{form} unless on (node, uuid) count_over_time({hist.sel('spin')}[{hist.h}])"


def idle_held_promql(st: Steps) -> str:
    """The recording rule ``uuid:gpu_idle_held:count1m``: the devices idle or spinning in
    the minute (their recorded flags) that a container held in it
    (``container:gpu_held_share:max1m``), with how many held them; sparse."""
    held = f"count by (node, uuid) (last_over_time({st.sel(RULES['held_share'])}[{st.r}]))"
    return (f"{held} and on (node, uuid) (last_over_time({st.sel(RULES['idle'])}[{st.r}])"
            f" or last_over_time({st.sel(RULES['spin'])}[{st.r}]))")


def held_runs_promql(hist: History) -> str:
    """With the recording rules: in how many of the history's recorded minutes a container
    held each device idle or spinning at the end (:attr:`~..series.Runs.held` where it is
    all of them), for the waste split: the minutes of ``uuid:gpu_idle_held:count1m`` (the
    idle or spinning devices held in the minute), a sparse series of those devices alone,
    so that one query over the fleet reads no holder of a busy device. Where a device was
    idle or spinning at every minute, as a summarised finding is, these are the minutes it
    was held; elsewhere fewer, and its allocation's steps are asked as before. Counted on
    the recorded minutes, whatever the scrape interval (not on
    ``container_gpu_allocated``'s samples: on a 15-s scrape four a minute, so no device
    came out held at every minute, and every idle device's allocation was asked step by
    step)."""
    held = hist.sel("idle_held")
    return (f"max by (node, uuid) (count_over_time({held}[{hist.h}])) and on (node, uuid)"
            f" (last_over_time({hist.sel('idle')}[{hist.r}])"
            f" or last_over_time({hist.sel('spin')}[{hist.r}]))")


def run_rule() -> RunRule:
    """The recording-rule form of the idle devices' runs (:mod:`.runs`): each device idle
    or spinning in the minute (its recorded flags, as :func:`idle_gpus` counts a spinning
    device idle), its run's first minute, and over the run the minutes a container held it
    (``uuid:gpu_idle_held:count1m``) and the minutes it spun. A run that begins with the
    device's utilization series gets the history's benefit on the page."""
    flag = either(recorded("idle", GBY), recorded("spin", GBY))
    now = flag("")
    held = f"max by (node, uuid) (last_over_time({RULES['idle_held']}[{RULE_R}]))"
    return RunRule(
        "idle_run", GBY, flag, recorded("util_max", GBY),
        {"held": f"({now} * 0 + on (node, uuid) group_left () ({held} * 0 + 1))",
         "spun": f"({recorded('spin', GBY)('')} * 0 + 1)"})


#: A node's whole GPUs' idle runs (``node_run_rules``), by record key.
NODE_RUN_STATS = ("gpus", "since_max", "since_min", "since_sum", "held_sum", "spun_sum")


def node_run_rules() -> list[tuple[str, str]]:
    """The idle nodes' numbers from their GPUs' runs (``RULES["node_idle_*"]``), per node
    all of whose whole GPUs (``node:gpu_whole:count1m``) are in an idle run, without MIG
    slices: how many, their first minutes' latest, earliest and sum, and their held and
    spinning minutes summed. With them the page has a node's idle GPU-seconds and their
    held and spinning parts over any history that all its runs began before or after
    (:func:`node_idle_of`), from six numbers a node instead of six a GPU."""
    # (Which devices are MIG slices, seen in the minute: a failed scrape's staleness
    # marker at its end hides them, and their node looked like one without MIG.)
    slices = f'max_over_time(gpu_info{{parent_uuid!=""}}[{RULE_R}])'

    def whole(key: str) -> str:
        return (f"max by (node, uuid) (last_over_time({RULES[key]}[{RULE_R}]))"
                f" unless on (node, uuid) max by (node, uuid) ({slices})")
    runs = whole("idle_run_since")
    gpus = f"max by (node) (last_over_time({RULES['node_gpus']}[{RULE_R}]))"
    # The nodes, found once (the first record): the others read it.
    node = f"max by (node) (last_over_time({RULES['node_idle_gpus']}[{RULE_R}]))"
    return [(RULES["node_idle_gpus"],
             f"(count by (node) ({runs}) == on (node) {gpus})"
             f" unless on (node) count by (node) ({slices})"),
            *((RULES[f"node_idle_{stat}"], f"{fn} by (node) ({of}) and on (node) {node}")
              for stat, fn, of in (("since_max", "max", runs), ("since_min", "min", runs),
                                   ("since_sum", "sum", runs),
                                   ("held_sum", "sum", whole("idle_run_held_sum")),
                                   ("spun_sum", "sum", whole("idle_run_spun_sum"))))]


@dataclass(frozen=True, slots=True)
class NodeRun:
    """A node's whole GPUs' idle runs as :func:`node_run_rules` records them (first minutes
    in seconds since the epoch; minutes summed over the GPUs), ``before`` the held and
    spinning sums at the page's history start where every run began by then."""

    gpus: int
    since_max: float
    since_min: float
    since_sum: float
    held_sum: float
    spun_sum: float
    before: tuple[float, float] | None = None


def node_given(run: NodeRun, window: Window, history_start: float) -> bool:
    """Whether a node's numbers give its idle verdict (:func:`node_idle_of`): every run on
    it began by the history's start (and the sums then are known), or two of the page's
    steps after it or later (none may have the history's benefit)."""
    if run.since_max <= history_start:
        return run.before is not None
    return run.since_min - RULE_INTERVAL > history_start + 2 * window.step


def node_idle_of(node: str, run: NodeRun, window: Window, history_start: float, *,
                 duration: float = IDLE_DURATION) -> NodeIdle | None:
    """The node's :class:`NodeIdle` from its recorded numbers where they give it: every
    run began by the history's start (each holds all of it: the sums' growth since, per
    GPU-minute of the history), or every run began two steps after it or later (each its
    own: the held and spinning parts a minute each); None otherwise (its GPUs' runs, read
    for the node, give it: :func:`gpu_idle_of`). ``allocated_gpus`` and ``spinning_gpus``
    are left 0: the rows read them of the GPUs."""
    if not node_given(run, window, history_start):
        return None
    required = required_seconds(duration, window, history_start)
    history = max(0.0, window.end - history_start)
    n = run.gpus
    if run.since_max <= history_start and run.before is not None:
        minutes = round((window.end - history_start) / RULE_INTERVAL)
        per = (window.end - history_start) / minutes if minutes else 0.0
        seconds, since = n * (window.end - history_start), history_start
        held = (run.held_sum - run.before[0]) * per
        spun = (run.spun_sum - run.before[1]) * per
    else:
        seconds = n * (window.end + RULE_INTERVAL) - run.since_sum
        since = run.since_max - RULE_INTERVAL
        held, spun = run.held_sum * RULE_INTERVAL, run.spun_sum * RULE_INTERVAL
    if not holds(Run(since, window.end, 0), required):
        return None
    return NodeIdle(node=node, gpus=n, idle_since=since, idle_gpu_seconds=seconds,
                    allocated_gpu_seconds=held, allocated_gpus=0, required_seconds=required,
                    history_seconds=history, spinning_gpu_seconds=spun)


def gpu_idle_of(ref: GpuRef, run: RecordedRun, window: Window, history_start: float, *,
                signal: str = "utilization", duration: float = IDLE_DURATION) -> GpuIdle:
    """The idle verdict of a device idle or spinning at the end, from its recorded run
    (:func:`run_rule`): what :func:`idle_gpus` gives of the same minutes (the held and
    spinning parts in proportion to the run's minutes, as it takes them of its steps)."""
    required = required_seconds(duration, window, history_start)
    r, n = run.on_page(window, history_start), run.minutes_in(history_start)
    return GpuIdle(ref, holds(r, required), r.start, r.seconds,
                   r.seconds * run.total("held") / n if n else 0.0, required,
                   max(0.0, window.end - history_start),
                   spinning_seconds=r.seconds * run.total("spun") / n if n else 0.0,
                   signal=signal)
