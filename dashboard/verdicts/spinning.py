"""Spinning GPUs: busy by utilization, doing no work.

``gpu_utilization_ratio`` counts the time *any* kernel ran, so a rank waiting in an NCCL
collective, a job hung in one, or a busy-wait reads 100 %. A step spins when the GPU's mean
utilization is >= ``busy`` (0.5) and

- with GPM: SM activity < ``sm`` (0.3), tensor activity < ``tensor`` (0.02) and DRAM
  activity < ``dram`` (0.02) (NCCL keeps one CTA per channel spinning, so a few SMs stay
  active: SM activity alone is not zero, tensor and DRAM activity are);
- without GPM: power < ``power`` (0.25) x the power limit (the step's own: a limit changed
  within the window judges the steps after the change);

and a GPU spins when its steps have for >= ``duration`` (30 min, shortened to the window and
the history collected). Every value is a mean over its step from ``rate()`` of a counter.
A missing value fails the step, so a device that lacks a signal is never called spinning.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpuscope.dashboard import fmt, ids
from gpuscope.dashboard.data.recorded import GBY, History, Steps
from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.links import at_node, node_link, workload_link
from gpuscope.dashboard.series import (
    ContainerRef,
    GpuRef,
    Runs,
    Series,
    Window,
    WorkSignals,
    index_key,
)
from gpuscope.dashboard.verdicts.cells import for_cell, pods_cell, signal_cell
from gpuscope.dashboard.verdicts.common import (
    holds,
    is_fresh,
    required_seconds,
    runs_from,
    tails_from,
    trailing_run,
)
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table, Threshold
from gpuscope.dashboard.verdicts.runs import RecordedRun, RunRule, either, recorded

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.verdicts.page import PageContext

SPIN_BUSY = 0.5
SPIN_SM = 0.3
SPIN_TENSOR = 0.02
SPIN_DRAM = 0.02
SPIN_POWER = 0.25
SPIN_DURATION = 30 * 60.0

THRESHOLDS = (
    Threshold("spin_busy", "ratio", "a GPU can spin at this utilization or more"),
    Threshold("spin_sm", "ratio", "... with GPM: spins below this SM activity"),
    Threshold("spin_tensor", "ratio", "... and below this tensor activity"),
    Threshold("spin_dram", "ratio", "... and below this DRAM activity"),
    Threshold("spin_power", "ratio",
              "... without GPM: spins below this share of its power limit"),
    Threshold("spin_duration", "seconds", "... for at least this long"),
)


@dataclass(frozen=True, slots=True)
class Spinning:
    """A device whose latest steps spin. ``spinning``: for long enough (the verdict);
    ``signal``: ``gpm`` or ``power`` ("": not read yet, a run the store summarised whose
    other signals are read for the rows shown); the values are means over the spinning run
    (``sm``/``tensor``/``dram`` with GPM; without, ``power_ratio``: the mean of each step's
    power over that step's limit)."""

    ref: GpuRef
    signal: str
    spinning: bool
    since: float
    seconds: float
    required_seconds: float
    history_seconds: float
    utilization: float
    sm: float | None = None
    tensor: float | None = None
    dram: float | None = None
    power_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class SpinRule:
    busy: float = SPIN_BUSY
    sm: float = SPIN_SM
    tensor: float = SPIN_TENSOR
    dram: float = SPIN_DRAM
    power: float = SPIN_POWER


def _spin_step(ref: GpuRef, signals: WorkSignals, rule: SpinRule,
               at: Mapping[str, Mapping[float, float]], t: float) -> bool:
    util = at["utilization"].get(t)
    if util is None or util < rule.busy:
        return False
    if ref in signals.gpm:
        sm, tensor, dram = at["sm"].get(t), at["tensor"].get(t), at["dram"].get(t)
        return (sm is not None and tensor is not None and dram is not None
                and sm < rule.sm and tensor < rule.tensor and dram < rule.dram)
    limit = at["limit"].get(t, signals.power_limit.get(ref))
    power = at["power"].get(t)
    return power is not None and limit is not None and limit > 0 and power < rule.power * limit


def _points(ref: GpuRef, signals: WorkSignals) -> dict[str, dict[float, float]]:
    def of(m: Mapping[GpuRef, Series]) -> dict[float, float]:
        s = m.get(ref)
        return s.at() if s is not None else {}

    return {"utilization": of(signals.utilization), "sm": of(signals.sm),
            "tensor": of(signals.tensor), "dram": of(signals.dram), "power": of(signals.power),
            "limit": of(signals.power_limits)}


def _may_spin(ref: GpuRef, util: Series, signals: WorkSignals, rule: SpinRule) -> bool:
    """False when no step of the device can spin: its utilization never reaches the rule's,
    or its SM activity (with GPM), else its power, never falls below the rule's (a busy
    workload's devices, most of what the work signals hold, fail here without a look at
    each step)."""
    if not any(v >= rule.busy for v in util.values):
        return False
    if ref in signals.gpm:
        sm = signals.sm.get(ref)
        return sm is not None and any(v < rule.sm for v in sm.values)
    power, limit = signals.power.get(ref), signals.power_limit.get(ref)
    steps = signals.power_limits.get(ref)
    highest = max([limit, *steps.values]) if limit is not None and steps is not None else limit
    return (power is not None and highest is not None and highest > 0
            and any(v < rule.power * highest for v in power.values))


def spinning_steps(signals: WorkSignals, rule: SpinRule | None = None,
                   runs: Runs | None = None) -> dict[GpuRef, frozenset[float]]:
    """The step times at which each device spins (devices that never do are left out).
    ``runs``: a device the store found spinning at every step of the history, or at every
    one from a later step (:class:`~..series.Runs`), spins at each of them, whatever steps
    of its signals came too (the store judged it on all of them; a straggler's peers' steps
    may bring a few)."""
    rule = rule or SpinRule()
    out: dict[GpuRef, frozenset[float]] = {}
    whole = runs.spinning if runs is not None else {}
    if whole and runs is not None:
        tail = tails_from(runs.steps)
        out.update({ref: tail(runs.spinning_from.get(ref, 0)) for ref in whole})
    for ref, util in signals.utilization.items():
        if ref in whole or not _may_spin(ref, util, signals, rule):
            continue
        aligned = _aligned(ref, util, signals)
        if aligned is not None:
            # _spin_step's test over the lined-up values (a missing signal fails every step).
            if ref in signals.gpm:
                sms, tensors, drams = (aligned.get("sm"), aligned.get("tensor"),
                                       aligned.get("dram"))
                steps = frozenset() if sms is None or tensors is None or drams is None else (
                    frozenset(t for t, u, s, x, d in zip(util.times, util.values, sms, tensors,
                                                         drams, strict=True)
                              if u >= rule.busy and s < rule.sm and x < rule.tensor
                              and d < rule.dram))
            else:
                # Each step's power against that step's limit (else the latest).
                powers, limit = aligned.get("power"), signals.power_limit.get(ref)
                limits = signals.power_limits.get(ref)
                per = limits.at() if limits is not None else {}
                steps = frozenset() if powers is None else frozenset(
                    t for t, u, p in zip(util.times, util.values, powers, strict=True)
                    if not u < rule.busy and (lim := per.get(t, limit)) is not None
                    and lim > 0 and p < rule.power * lim)
            if steps:
                out[ref] = steps
            continue
        at = _points(ref, signals)
        if ref in signals.gpm:
            # _spin_step's test, written out for the steps of one device (a fleet page has
            # 10^5 of them).
            sm, tensor, dram = at["sm"], at["tensor"], at["dram"]
            steps = frozenset(
                t for t, u in at["utilization"].items()
                if u >= rule.busy and (s := sm.get(t)) is not None and s < rule.sm
                and (x := tensor.get(t)) is not None and x < rule.tensor
                and (d := dram.get(t)) is not None and d < rule.dram)
        else:
            steps = frozenset(t for t in util.times if _spin_step(ref, signals, rule, at, t))
        if steps:
            out[ref] = steps
    return out


def spin_begins(signals: WorkSignals, devices: Collection[GpuRef],
                runs: Runs | None = None) -> dict[GpuRef, float]:
    """Where each of ``devices`` can first be judged by the spinning rule: the first step at
    which every signal its rule reads has a value (SM, tensor and DRAM activity with GPM, else
    power). Before it, a busy step is *unknown*, neither spinning nor working: GPM's rates
    start a sampling round or two after utilization's. Both the spinning verdict and the idle
    verdict start the device's steps there, so that they rest on one history. A device the
    store found spinning at every step (``runs``) is judged from the first of them."""
    out: dict[GpuRef, float] = {}
    whole = runs.spinning if runs is not None and runs.steps else {}
    for ref in devices:
        if ref in whole and runs is not None:
            out[ref] = runs.steps[0]
            continue
        needed = ((signals.sm, signals.tensor, signals.dram) if ref in signals.gpm
                  else (signals.power,))
        firsts = [s.times[0] for m in needed if (s := m.get(ref)) is not None and s.times]
        if len(firsts) == len(needed):
            out[ref] = max(firsts)
    return out


def _mean(at: Mapping[float, float], times: list[float]) -> float | None:
    values = [at[t] for t in times if t in at]
    return sum(values) / len(values) if values else None


_SIGNALS = ("utilization", "sm", "tensor", "dram")  # power: as a share of its limit


def _aligned(ref: GpuRef, util: Series, signals: WorkSignals
             ) -> dict[str, tuple[float, ...]] | None:
    """Each signal's values, where every signal the device has comes at ``util``'s own
    times (one query's series, and the run summaries', do): their steps line up and are
    read by position, without a ``{time: value}`` dict each (a fleet page has 10^3
    spinning devices, 5 signals, 60 steps). None where they do not line up."""
    out = {}
    for name, series in (("utilization", util), ("sm", signals.sm.get(ref)),
                         ("tensor", signals.tensor.get(ref)), ("dram", signals.dram.get(ref)),
                         ("power", signals.power.get(ref))):
        if series is None:
            continue
        if series.times is not util.times and series.times != util.times:
            return None
        out[name] = series.values
    return out


def _tail_mean(values: tuple[float, ...] | None, first: int) -> float | None:
    """The mean of ``values`` from position ``first`` on (:func:`_mean` over aligned
    steps: the same values, summed in the same order)."""
    if values is None:
        return None
    tail = values[first:]
    return sum(tail) / len(tail) if tail else None


def _power_ratio(times: Sequence[float], power: Sequence[float | None],
                 limits: Mapping[float, float], latest: float | None) -> float | None:
    """The mean over ``times`` of each step's power (``power``, watts, by position) over
    that step's own limit (``limits``, watts, by time; ``latest`` where a step has none), as
    the rule compares them step by step: the mean power over the latest limit alone read a
    run under a cap raised since as less of its limit than it was. None where no step has
    both."""
    ratios = [p / lim for t, p in zip(times, power, strict=True)
              if p is not None and (lim := limits.get(t, latest)) is not None and lim > 0]
    return sum(ratios) / len(ratios) if ratios else None


def work_means(means: Mapping[str, float]) -> dict[str, Any]:
    """A spinning run's fields of :class:`Spinning` from its signals' means as the store
    summarises them (``sm``, ``tensor``, ``dram`` with GPM; without, ``power_ratio``: the
    mean of each minute's power over that minute's limit, :func:`spinning_means_promql`):
    its ``signal`` ("" where neither came: not read) and means."""
    ratio = means.get("power_ratio")
    if "sm" in means:
        return {"signal": "gpm", "sm": means.get("sm"), "tensor": means.get("tensor"),
                "dram": means.get("dram"), "power_ratio": None}
    if ratio is not None:
        return {"signal": "power", "sm": None, "tensor": None, "dram": None,
                "power_ratio": ratio}
    return {"signal": "", "sm": None, "tensor": None, "dram": None, "power_ratio": None}


def spinning_gpus(
    signals: WorkSignals,
    window: Window,
    history_start: float,
    *,
    rule: SpinRule | None = None,
    duration: float = SPIN_DURATION,
    steps: Mapping[GpuRef, frozenset[float]] | None = None,
    runs: Runs | None = None,
) -> dict[GpuRef, Spinning]:
    """Every device spinning at the latest step, with its trailing run; ``spinning`` is the
    verdict (the run is at least min(duration, window, history) long). ``steps``: the
    devices' spinning steps when :func:`spinning_steps` has found them already. ``runs``:
    the devices the store found spinning at every step of the history, with their means
    (:class:`~..series.Runs`): their findings as the store gives them."""
    rule = rule or SpinRule()
    if steps is None:
        steps = spinning_steps(signals, rule, runs)
    required = required_seconds(duration, window, history_start)
    history = max(0.0, window.end - history_start)
    out: dict[GpuRef, Spinning] = {}
    whole = runs.spinning if runs is not None else {}
    run_from = runs_from(runs.steps if runs is not None else (), window, history_start)
    for ref, means in whole.items():
        run = run_from(runs.spinning_from.get(ref, 0) if runs is not None else 0)
        if run is not None:
            out[ref] = Spinning(
                ref=ref, spinning=holds(run, required), since=run.start,
                seconds=run.seconds, required_seconds=required, history_seconds=history,
                utilization=means.get("utilization", 0.0), **work_means(means))
    for ref, util in signals.utilization.items():
        spins = steps.get(ref)
        if not spins or ref in whole:
            continue  # no step spins: no trailing run
        gpm = ref in signals.gpm
        aligned = _aligned(ref, util, signals)
        at: dict[str, dict[float, float]] = {}
        if aligned is not None:
            # Every signal has a value at every step of the utilization's: the steps begin
            # with its first (as below), and the run's means are read by position.
            times = list(util.times)
        else:
            at = _points(ref, signals)
            # Before the rule's other signals have their first value nothing is known (a
            # series' start, not a step that failed the rule): the device's steps begin
            # there.
            begins = spin_begins(signals, (ref,)).get(ref)
            times = [t for t in util.times if begins is None or t >= begins]
        if not is_fresh(times, window):
            continue
        run = trailing_run(times, [t in spins for t in times], window.step, history_start)
        if run is None:
            continue
        # Each signal's mean over the run; power as a share of each step's own limit.
        ratio: float | None = None
        if aligned is not None:
            mean = {n: _tail_mean(aligned.get(n), run.first_index) for n in _SIGNALS}
            powers: Sequence[float | None] | None = aligned.get("power")
        else:
            mean = {n: _mean(at[n], times[run.first_index:]) for n in _SIGNALS}
            powers = [at["power"].get(t) for t in times]
        if not gpm and powers is not None:
            limits = signals.power_limits.get(ref)
            ratio = _power_ratio(times[run.first_index:], powers[run.first_index:],
                                 limits.at() if limits is not None else {},
                                 signals.power_limit.get(ref))
        out[ref] = Spinning(
            ref=ref,
            signal="gpm" if gpm else "power",
            spinning=holds(run, required),
            since=run.start,
            seconds=run.seconds,
            required_seconds=required,
            history_seconds=history,
            utilization=mean["utilization"] or 0.0,
            sm=mean["sm"] if gpm else None,
            tensor=mean["tensor"] if gpm else None,
            dram=mean["dram"] if gpm else None,
            power_ratio=ratio,
        )
    return out


# -- on the page -----------------------------------------------------------------------------

SPINNING_COLUMNS = (
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("pods", "Pod", "link"),
    Column("workload", "Workload", "link"),
    Column("utilization", "Utilization", "percent"),
    Column("work", "Work done"),
    Column("for", "Spinning for"),
    Column("price", "$/hour", "money"),
    Column("signal", "Judged by"),
)
SECTION = Section(
    id=ids.SECTION_SPINNING, title="Spinning GPUs",
    intro="GPUs at high utilization doing no work: no tensor or memory activity and few SMs "
          "active (GPM), or power far below the limit (no GPM). A job hung in a collective or "
          "a busy-wait. They count as idle in the cost above.",
    tables=(Table(ids.SPINNING_GPUS_TABLE, ids.SPINNING_NOTE, SPINNING_COLUMNS, order="price"),),
)

# -- its findings as table rows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpinningRow:
    """A GPU busy by utilization doing no work for long enough: a hung collective or a
    busy-wait. ``signal``: ``gpm`` (SM, tensor and DRAM activity) or ``power``."""

    node: str
    gpu: str
    uuid: str
    pods: tuple[str, ...]          # "namespace/pod"
    workloads: tuple[str, ...]     # "namespace/Kind/name"
    signal: str
    utilization: float
    sm: float | None
    tensor: float | None
    dram: float | None
    power_ratio: float | None
    since: float
    seconds: float
    required_seconds: float
    history_seconds: float
    price_per_hour: float | None
    price_basis: str


def spinning_rows(spinning: Mapping[GpuRef, Spinning], ctx: PageContext,
                  users: Mapping[GpuRef, Collection[ContainerRef]],
                  workload_of: Mapping[tuple[str, str, str], str]) -> tuple[SpinningRow, ...]:
    """The spinning table's rows, dearest first, then by node and GPU index: each device
    of ``spinning`` (its findings that hold) with the pods and workloads of its ``users``
    (containers; ``workload_of`` by node, namespace and pod), priced by ``ctx``; under a
    namespace filter, the devices one of its containers uses."""
    def price(ref: GpuRef) -> float | None:
        return ctx.gpu_price.get(ref.node)

    return tuple(
        SpinningRow(
            node=ref.node, gpu=ctx.index(ref), uuid=ref.uuid,
            pods=tuple(sorted({f"{c.namespace}/{c.pod}" for c in users.get(ref, ())})),
            workloads=tuple(sorted({f"{c.namespace}/{w}" for c in users.get(ref, ())
                                    if (w := workload_of.get((c.node, c.namespace, c.pod)))})),
            signal=v.signal, utilization=v.utilization, sm=v.sm, tensor=v.tensor, dram=v.dram,
            power_ratio=v.power_ratio, since=v.since, seconds=v.seconds,
            required_seconds=v.required_seconds, history_seconds=v.history_seconds,
            price_per_hour=price(ref), price_basis=ctx.basis(ref.node),
        )
        for ref, v in sorted(spinning.items(), key=lambda item: (
            -(price(item[0]) or 0.0), item[0].node, index_key(ctx.index(item[0])),
            item[0].uuid))
        if ctx.namespace is None or any(c.namespace == ctx.namespace
                                        for c in users.get(ref, ()))
    )


def spinning_data(rows: Sequence[SpinningRow], state: State | None = None) -> list[Row]:
    state = state or {}
    out: list[Row] = []
    for r in rows:
        if r.signal == "gpm":
            work = (f"SM {fmt.pct(r.sm)}, tensor {fmt.pct(r.tensor)}, "
                    f"DRAM {fmt.pct(r.dram)}")
        elif r.signal == "power":
            work = f"power {fmt.pct(r.power_ratio)} of its limit"
        else:
            work = "not read (see the page's notes)"
        here = at_node(state, r.node)  # a pod's or workload's link names the row's cluster
        out.append({
            "node": node_link(r.node, state), "gpu": r.gpu, "pods": pods_cell(r.pods, here),
            "workload": ", ".join(workload_link(w.partition("/")[0], w.partition("/")[2], here)
                                  for w in r.workloads),
            "utilization": r.utilization, "work": work,
            "for": for_cell(r.seconds, r.required_seconds), "price": r.price_per_hour,
            "signal": signal_cell(r.signal, r.price_basis),
        })
    return out


@dataclass(frozen=True, slots=True)
class RowWork:
    """What the spinning table's rows show of a run the store summarised beyond its verdict
    (its SM, tensor and DRAM activity, or its power as a share of its limit), read when the rows
    are shown (:meth:`__call__`): from ``read`` (the store: the means on the given nodes of
    the devices spinning over the whole history, and of those whose run began within it,
    ``FleetData.read_spinning``) for the rows shown alone; ``trailing``: the devices whose
    run began within the history."""

    read: Callable[[Collection[str], Collection[str]], Mapping[GpuRef, Mapping[str, float]]]
    trailing: frozenset[GpuRef] = frozenset()

    def __call__(self, rows: Sequence[SpinningRow], first: int
                 ) -> tuple[tuple[SpinningRow, ...], str | None]:
        """``rows`` with the means of the first ``first`` of them read where they are not
        yet (one round of queries, none where there is nothing to read), and a line for the
        page's notes where the store failed (those rows stay unread)."""
        todo = [GpuRef(r.node, r.uuid) for r in rows[:first] if not r.signal]
        if not todo:
            return tuple(rows), None
        try:
            means = self.read({g.node for g in todo if g not in self.trailing},
                              {g.node for g in todo if g in self.trailing})
        except DataError as exc:
            return tuple(rows), (f"The spinning GPUs' SM activity and power could not be read "
                                 f"({exc}).")
        return tuple(
            replace(r, **work_means(m)) if i < first and not r.signal
            and (m := means.get(GpuRef(r.node, r.uuid))) else r
            for i, r in enumerate(rows)), None


# -- as PromQL --------------------------------------------------------------------------------
# Its rule per step, over the raw series or the recording rules (:class:`~gpuscope.dashboard.
# data.recorded.Steps`): dashboard/plan/ sends it, the gpuscope-dashboard rules record it.


def spinning_promql(st: Steps, th: Thresholds) -> str:
    """The devices that spin (busy by utilization, no work: with GPM, SM, tensor and
    DRAM activity below the rule's; without, power below its share of the limit);
    value: the utilization. :mod:`..analysis.spinning`'s rule."""
    rule = th.spin_rule
    sm = st.active("sm")
    gpm = (f"({sm} < {rule.sm!r}) and on (node, uuid) ({st.active('tensor')} < "
           f"{rule.tensor!r}) and on (node, uuid) ({st.active('dram')} < {rule.dram!r})")
    power = (f"({st.power()} < on (node, uuid) ({rule.power!r} * {st.limit()}))"
             f" unless on (node, uuid) {sm}")
    return (f"({st.util()} >= {rule.busy!r})"
            f" and on (node, uuid) (({gpm}) or on (node, uuid) ({power}))")


def spinning_runs_promql(hist: History) -> str:
    """With the recording rules: the devices spinning at every minute of the history (on
    one-minute steps: at the end, a run where :func:`spinning_minutes_promql` says how long
    it is), with the mean of their utilization over the history's spinning minutes (the
    recorded series' own value: it has no other)."""
    return f"{hist.mean('spin', GBY)} and on (node, uuid) {hist.held('spin', GBY)}"


def spinning_minutes_promql(hist: History) -> str:
    """With the recording rules: how many minutes each device spinning at the end has spun
    without a gap (from its first in the history, :meth:`~..data.recorded.History.run`),
    where it was not idle in the history (a spinning step is idle for the idle verdict: its
    steps say when its idle run began)."""
    return (f"{hist.run('spin', GBY)}"
            f" unless on (node, uuid) count_over_time({hist.sel('idle')}[{hist.h}])")


def spinning_means_promql(hist: History) -> dict[str, str]:
    """With the recording rules, of the devices :func:`spinning_runs_promql` gives on its
    nodes: the means of their other signals over their spinning minutes in the history, by
    signal (``sm``, ``tensor``, ``dram`` with GPM; without, ``power_ratio``: the mean of
    each minute's power over that minute's limit, as the rule compares them minute by
    minute (:meth:`~..data.recorded.History.ratio_while`): the mean power over the
    range's highest limit read a run under a cap raised since as less of its limit than it
    was)."""
    mine = hist.held("spin", GBY, everywhere=True)
    no_gpm = f"unless on (node, uuid) count_over_time({hist.sel('sm')}[{hist.h}])"
    return {
        **{key: f"{hist.mean_while(key, 'spin', GBY)} and on (node, uuid) {mine}"
           for key in ("sm", "tensor", "dram")},
        "power_ratio": (f"{hist.ratio_while('power', 'gpu_power_limit_watts', 'spin', GBY)}"
                        f" and on (node, uuid) {mine} {no_gpm}"),
    }


def run_rule() -> RunRule:
    """The recording-rule form of the spinning devices' runs (:mod:`.runs`), with the sum
    of their utilization (the flag's value) over the run: a run that
    begins with the device's work signals (SM activity, else power) gets the history's
    benefit on the page, as :func:`spin_begins` counts from their first step."""
    flag = recorded("spin", GBY)
    return RunRule("spin_run", GBY, flag, either(recorded("sm", GBY), recorded("power", GBY)),
                   {"utilization": flag("")})


def spinning_of(ref: GpuRef, run: RecordedRun, window: Window, history_start: float, *,
                gpm: bool, duration: float = SPIN_DURATION) -> Spinning:
    """The device's spinning finding from its recorded run (:func:`run_rule`): its mean
    utilization over the run (its other signals' means are read for the rows shown:
    :class:`RowWork`); ``gpm``: whether the device has GPM (its ``signal``)."""
    required = required_seconds(duration, window, history_start)
    r = run.on_page(window, history_start)
    return Spinning(ref=ref, signal="gpm" if gpm else "power",
                    spinning=holds(r, required), since=r.start, seconds=r.seconds,
                    required_seconds=required,
                    history_seconds=max(0.0, window.end - history_start),
                    utilization=run.mean("utilization", history_start) or 0.0)
