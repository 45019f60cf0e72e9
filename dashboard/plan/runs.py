"""The fleet page's plan of Prometheus queries, part two: what the first round singles out
for the second (:class:`FollowUp`), the run summaries the recording rules give
(:class:`_FullRuns`, :class:`_StragglerRuns`), the straggler groups and node summaries, and
the answers read by role (:class:`_Answers`)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscope.dashboard.data.prometheus import _cref, _gref
from gpuscope.dashboard.data.promql import cluster_of_series
from gpuscope.dashboard.data.recorded import RULE_INTERVAL
from gpuscope.dashboard.series import (
    MAX_HEATMAP_NODES,
    ContainerRef,
    Evidence,
    GpuInfo,
    GpuRef,
    GroupKey,
    GroupRun,
    NodeSummary,
    PodInfo,
    PodKey,
    Runs,
    Series,
    Window,
    summary_mean,
)
from gpuscope.dashboard.verdicts.stragglers import group_of

_NO_POINTS = Series((), ())

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


@dataclass(frozen=True, slots=True)
class FollowUp:
    """What the first round singled out for the second: the nodes each history is asked
    about (a node's every device or container comes back; the analysis judges them)."""

    idle: Collection[str] = ()
    idle_nodes: Collection[str] = ()
    shared: Collection[str] = ()
    #: The time-sliced devices (uuids) themselves, where known: their steps are asked by
    #: device, not by ``shared``'s nodes (whose other devices and containers the store
    #: would read only to leave them out).
    shared_devices: Collection[str] = ()
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
    recorded minute of the history, ``(history start, end]``, and so at each of its steps
    (``grid``), or (idle and spinning devices, allocated-idle containers, on one-minute
    steps) at every one from a later minute to the end (``*_from``: the index of the run's
    first step): one summary each, their mean over that run. :meth:`summary` hands them to
    the verdicts as findings (:class:`Runs`); :meth:`fallback` names the nodes of the rest,
    whose steps must be asked for."""

    grid: tuple[float, ...]
    #: The history's recorded minutes (as many samples of a one-minute scrape).
    minutes: int
    idle: dict[GpuRef, str] = field(default_factory=dict)               # signal
    idle_from: dict[GpuRef, int] = field(default_factory=dict)          # first step's index
    spin: dict[GpuRef, dict[str, float]] = field(default_factory=dict)  # signal -> mean
    spin_from: dict[GpuRef, int] = field(default_factory=dict)          # first step's index
    held_steps: dict[GpuRef, float] = field(default_factory=dict)       # samples held
    held_idle: dict[ContainerRef, tuple[str, float]] = field(default_factory=dict)
    held_idle_from: dict[ContainerRef, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, rows: Iterable[tuple[dict[str, str], float]], window: Window,
              steps: int, minutes: int, trailing: bool = False) -> _FullRuns:
        """The summaries of ``rows``, over the last ``steps`` steps of ``window`` (its last
        ``minutes`` minutes): those of the whole history (the forms asked them alone), or
        (``trailing``: the forms on one-minute steps) every run up to the end whose length
        came with it (``*_n``)."""
        grid = tuple(window.end - (steps - 1 - i) * window.step for i in range(steps))
        out = cls(grid, minutes)

        def first_step(held_for: float) -> int | None:
            """The index of the first step of a run of ``held_for`` minutes without a gap
            up to the end: 0 for the history's all, else the first step all of whose
            minutes it holds (a step of ``m`` minutes meets a sparse rule where each of its
            minutes does; on one-minute steps, the last ``held_for`` steps); None: not a
            run the steps can be (none of them whole)."""
            n = round(held_for)
            if n == minutes:
                return 0
            if not 0 < n < minutes:
                return None
            # Its first minute; a step's minutes end at the step (its first, a step less
            # one minute before).
            first = window.end - (n - 1) * RULE_INTERVAL
            k = math.ceil((first + window.step - RULE_INTERVAL - grid[0]) / window.step
                          - 1e-9)
            return k if 0 < k < steps else None

        held_idle_for: dict[ContainerRef, float] = {}
        spun_for: dict[GpuRef, float] = {}
        for lab, v in rows:
            stat, ref = lab.get("stat", ""), _gref(lab)
            if stat == "idle":
                k = first_step(v)
                if k is not None:
                    out.idle[ref] = lab.get("signal", "utilization")
                    if k:
                        out.idle_from[ref] = k
            elif stat == "spin":
                out.spin.setdefault(ref, {})[lab.get("signal", "")] = v
            elif stat == "spin_n":
                spun_for[ref] = v
            elif stat == "held":
                out.held_steps[ref] = v
            elif stat == "held_idle":
                out.held_idle[_cref(lab)] = (lab.get("signal", "utilization"), v)
            elif stat == "held_idle_n":
                held_idle_for[_cref(lab)] = v
        if not trailing:  # the forms gave the whole history's runs alone
            return out
        # An allocated-idle container is summarised with the run its minutes make.
        for cref in list(out.held_idle):
            k = first_step(held_idle_for.get(cref, 0.0))
            if k is None:
                del out.held_idle[cref]
            elif k:
                out.held_idle_from[cref] = k
        # A spinning device is summarised only with its utilization (its rule's first term),
        # and with the run its minutes make where its steps alone give that run: the
        # spinning verdict reads every step of a device's signals, so a run from the
        # second or third step would begin at the history's start in the summary
        # (:func:`~..verdicts.common.trailing_run`) and at its step in the steps.
        for ref in list(out.spin):
            k = first_step(spun_for.get(ref, 0.0))
            if ("utilization" not in out.spin[ref] or k is None or 0 < k <= 2
                    or (k and steps != minutes)):
                del out.spin[ref]
            elif k:
                out.spin_from[ref] = k
        return out

    def merged(self, more: _FullRuns) -> _FullRuns:
        """These summaries (of the whole history) with ``more``'s (the runs up to the end,
        on the same grid) for the findings these do not have: a whole run here comes with
        every mean it was asked with (``more`` asks the spinning devices' signals on the
        nodes of those it did not summarise only)."""
        return replace(
            self, idle={**more.idle, **self.idle},
            idle_from={r: k for r, k in more.idle_from.items() if r not in self.idle},
            spin={**more.spin, **self.spin},
            spin_from={r: k for r, k in more.spin_from.items() if r not in self.spin},
            held_idle={**more.held_idle, **self.held_idle},
            held_idle_from={r: k for r, k in more.held_idle_from.items()
                            if r not in self.held_idle})

    def fallback(self, idle: Collection[GpuRef], spinning: Collection[GpuRef],
                 held: Collection[ContainerRef]) -> FollowUp:
        """The nodes whose step histories are still needed: of the findings now (the first
        round's) not held over the whole history, and of the idle or spinning devices held
        by a container in only some of its steps (the waste split counts them)."""
        idle_rest = {g for g in idle if g not in self.idle}
        spin_rest = {g for g in spinning if g not in self.spin}
        partly_held = {g for g in [*idle, *spinning]
                       if g in self.held_steps and round(self.held_steps[g]) != self.minutes}
        return FollowUp(
            idle={g.node for g in idle_rest},
            idle_nodes={g.node for g in idle_rest | spin_rest | partly_held},
            spinning={g.node for g in spin_rest},
            held={c.node for c in held if c not in self.held_idle},
        )

    def summary(self, stragglers: Mapping[GroupKey, GroupRun]) -> Runs:
        """The findings summarised, as the data layer hands them over (:class:`Runs`), with
        the straggler groups described whole (:meth:`_StragglerRuns.whole`)."""
        return Runs(
            steps=self.grid, idle=dict(self.idle), idle_from=dict(self.idle_from),
            held=frozenset(g for g, c in self.held_steps.items()
                           if round(c) == self.minutes),
            spinning={ref: dict(means) for ref, means in self.spin.items()},
            spinning_from=dict(self.spin_from),
            held_idle=dict(self.held_idle), held_idle_from=dict(self.held_idle_from),
            stragglers=dict(stragglers))


def _group_key(lab: Mapping[str, str]) -> GroupKey:
    """The straggler group of a store's answer's series (a device's, or a group's own)."""
    return (cluster_of_series(lab), lab.get("namespace", ""), lab.get("workload", ""),
            lab.get("model", ""))


def _workload_key(lab: Mapping[str, str]) -> tuple[str, str, str]:
    """The workload (cluster, namespace, workload) of a store's answer's series."""
    return cluster_of_series(lab), lab.get("namespace", ""), lab.get("workload", "")


@dataclass
class _StragglerRuns:
    """The stragglers (from :meth:`PrometheusData.run_queries`) whose rule held at every step
    of the history: each device's mean over that run (``runs``: kind, signal, mean) and its
    group's median's mean over the same steps (``medians``, by group and kind: signal,
    mean). :meth:`split` says which groups flagged at the end they describe whole;
    :meth:`whole` gives those groups' findings (:class:`GroupRun`)."""

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

    def whole(self, keys: Iterable[GroupKey]) -> dict[GroupKey, GroupRun]:
        """The groups ``keys`` (from :meth:`split`) as the store found them: the rule, the
        median's mean and each straggler's mean over the history's steps."""
        out = {}
        for key in keys:
            runs = self.runs[key]
            kind = next(iter(runs.values()))[0]
            signal, median = self.medians[(key, kind)]
            out[key] = GroupRun(kind, "utilization" if kind == "stalled" else signal, median,
                                {g: v for g, (_, _, v) in runs.items()})
        return out


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
        key = group_of(c, pods, gpus, node_models)
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


def detail_nodes(named: Collection[str], summaries: Mapping[str, NodeSummary]) -> set[str]:
    """The nodes whose devices the fleet page reads with the rules: those ``named`` (a
    verdict, a time-sliced device or an input-starved candidate there, a straggler group's),
    those whose devices have several models (MIG), and the :data:`MAX_HEATMAP_NODES` least
    busy, which the heatmap may draw (its order, by the summaries' means, is
    :func:`..views.build_fleet_view`'s). Listed however many they are: where findings
    name most of the fleet, the lists (split under the query limit) cost the store no more
    than one query of every device (docs/benchmarks.md)."""
    lowest = sorted(summaries, key=lambda n: (summary_mean(summaries[n]), n))
    nodes = (set(named) | set(lowest[:MAX_HEATMAP_NODES])
             | {n for n, s in summaries.items() if not s.model})
    return nodes


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

