"""The dashboard's data model: time series on a step grid, and what the fleet looks like.

Both data modes (Prometheus, embedded scraping) produce a :class:`FleetData`; the analysis
functions and the views only ever see this, never PromQL or exposition text.

Time series are *bucketed*: a point at time ``t`` summarises the samples in ``(t - step, t]``
(the maximum, for idle detection, or the mean). Points of series from one query share their
timestamps, so values can be joined on time exactly.
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple


class _GcPause:
    """Counts the computations that hold the cyclic garbage collector off
    (:func:`gc_paused`), so that it comes back on when the last one ends, and only if it was
    on before the first began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_enabled = False


_GC_PAUSE = _GcPause()


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a fleet page is read and judged. A
    5,000-node page makes some 10^7 objects (the stores' answers decoded, the series, the
    verdicts), nearly all without cycles and freed by reference counting; with the collector
    on, the heap's growth set off full collections that each walked all of them again:
    1.6-1.9 s of the 6 s that ``PrometheusData.fleet`` took at 5,000 nodes
    (docs/benchmarks.md). Whatever cycles are made meanwhile are collected after. Nested
    and concurrent pauses (two pages at once, several threads) are counted."""
    with _GC_PAUSE.lock:
        if _GC_PAUSE.holders == 0:
            _GC_PAUSE.was_enabled = gc.isenabled()
            gc.disable()
        _GC_PAUSE.holders += 1
    try:
        yield
    finally:
        with _GC_PAUSE.lock:
            _GC_PAUSE.holders -= 1
            if _GC_PAUSE.holders == 0 and _GC_PAUSE.was_enabled:
                gc.enable()


@dataclass(frozen=True, slots=True)
class Window:
    """The selected time window: ``(start, end]`` evaluated every ``step`` seconds."""

    start: float
    end: float
    step: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def times(self) -> tuple[float, ...]:
        """Evaluation times from ``end`` backwards to ``start`` (inclusive), oldest first.

        Anchored at ``end`` so the newest point always covers the newest data.
        """
        n = int((self.end - self.start) // self.step + 1e-9)
        return tuple(self.end - (n - i) * self.step for i in range(n + 1))


@dataclass(frozen=True, slots=True)
class Series:
    """Values at increasing times (seconds since the epoch)."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times) != len(self.values):
            raise ValueError("times and values differ in length")

    def __len__(self) -> int:
        return len(self.times)

    def at(self) -> dict[float, float]:
        """``{time: value}``, for joining series of one query on their shared timestamps."""
        return dict(zip(self.times, self.values, strict=True))

    @property
    def last(self) -> float | None:
        return self.values[-1] if self.values else None


class GpuRef(NamedTuple):
    """A device (GPU or MIG slice) on a node, by UUID.

    The keys (this, :class:`ContainerRef`, :class:`PodKey`) are named tuples, not
    dataclasses: a 5,000-node fleet page makes some 10^5 of them and looks them up some
    10^6 times, and a tuple is made, hashed and compared in C (a frozen dataclass runs
    Python code for each)."""

    node: str
    uuid: str


class PodKey(NamedTuple):
    """A pod on a node."""

    node: str
    namespace: str
    pod: str


class ContainerRef(NamedTuple):
    """One container's use of one device."""

    node: str
    namespace: str
    pod: str
    container: str
    uuid: str

    # Made from the fields in C (``tuple.__new__`` over ``itemgetter``), without the named
    # tuples' own ``__new__`` in Python: the analysis asks for them some 10^5 times a page.
    @property
    def gpu(self) -> GpuRef:
        """The device it uses."""
        return _new_tuple(GpuRef, _NODE_UUID(self))

    @property
    def pod_key(self) -> PodKey:
        """Its pod."""
        return _new_tuple(PodKey, _NODE_NAMESPACE_POD(self))


_new_tuple = tuple.__new__
_NODE_UUID = itemgetter(0, 4)
_NODE_NAMESPACE_POD = itemgetter(0, 1, 2)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """``gpu_info`` of one device. ``gpu`` is the index label (``"3"``, or ``"7/1"`` for a
    MIG slice); a full GPU has an empty ``parent_uuid``."""

    node: str
    gpu: str
    uuid: str
    model: str = ""
    parent_uuid: str = ""
    mig_profile: str = ""
    #: ``GpuRef(node, uuid)``, made once: a fleet page's analysis reads it some 10^5 times.
    ref: GpuRef = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", GpuRef(self.node, self.uuid))

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> GpuInfo:
        """From a ``gpu_info`` series' labels (a store's answer, or a scraped series)."""
        return cls(labels.get("node", ""), labels.get("gpu", ""), labels.get("uuid", ""),
                   labels.get("model", ""), labels.get("parent_uuid", ""),
                   labels.get("mig_profile", ""))

    @property
    def is_physical(self) -> bool:
        """A whole GPU (possibly in MIG mode), not a MIG slice."""
        return not self.parent_uuid


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """``gpu_node_info`` of one node; empty strings where unknown."""

    node: str
    instance_type: str = ""
    zone: str = ""
    capacity_type: str = ""

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> NodeInfo:
        """From a ``gpu_node_info`` series' labels."""
        return cls(labels.get("node", ""), labels.get("instance_type", ""),
                   labels.get("zone", ""), labels.get("capacity_type", ""))


@dataclass(frozen=True, slots=True)
class PodInfo:
    """``gpu_pod_info``: ``workload`` is ``<Kind>/<name>`` of the pod's top owner, or empty."""

    node: str
    namespace: str
    pod: str
    workload: str = ""

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> PodInfo:
        """From a ``gpu_pod_info`` series' labels."""
        return cls(labels.get("node", ""), labels.get("namespace", ""), labels.get("pod", ""),
                   labels.get("workload", ""))

    @property
    def key(self) -> PodKey:
        return PodKey(self.node, self.namespace, self.pod)


@dataclass(frozen=True, slots=True)
class UtilStats:
    """Statistics of one container's raw utilization samples over the window."""

    mean: float
    stddev: float
    samples: int
    memory_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a straggler's cause may show, over the last ``seconds`` of the window: throttle
    seconds per second by reason (``rate(gpu_throttle_seconds_total)``), and the mean SM
    clock (Hz) and temperature (C). None where the device does not report it."""

    throttle: Mapping[str, float] = field(default_factory=dict)
    sm_clock_hertz: float | None = None
    temperature_celsius: float | None = None


@dataclass(frozen=True, slots=True)
class WorkSignals:
    """The work signals of DESIGN.md per device, one point per step, each the *mean over the
    step* from ``rate()`` of its counter (never an average of scraped gauges):

    - ``utilization``: ``rate(gpu_busy_seconds_total)``, else the mean of
      ``gpu_utilization_ratio`` where a device has no busy counter;
    - ``sm``, ``tensor``, ``dram``: ``rate(gpu_{sm,tensor,dram}_active_seconds_total)`` (GPM);
    - ``power``: watts, ``rate(gpu_energy_joules_total)``, else the mean of ``gpu_power_watts``;
    - ``power_limit``: each device's latest ``gpu_power_limit_watts``;
    - ``power_limits``: each device's ``gpu_power_limit_watts`` per step (the highest
      sample in the step, as the rule's PromQL reads it): the spinning rule compares each
      step's power with that step's limit (a limit changed within the window, a power cap
      lifted, does not judge the steps before it), the latest one where a step has none;
    - ``gpm``: the devices that have GPM series in the window (the others are judged by the
      fallbacks: power for spinning and slow ranks, processes for MIG slices);
    - ``throttle``: per device and reason, ``rate(gpu_throttle_seconds_total)``, for the
      node view only (the fleet page's throttled verdict asks its own step queries:
      :mod:`~gpuscope.dashboard.verdicts.throttle`).

    The Prometheus mode sends a value only at the steps where some verdict can use it (a
    spinning step, a busy step of a workload with a slow-rank candidate);
    every rule treats a missing value as "condition not met", so leaving out steps that
    cannot meet a condition changes no verdict.
    """

    utilization: Mapping[GpuRef, Series] = field(default_factory=dict)
    sm: Mapping[GpuRef, Series] = field(default_factory=dict)
    tensor: Mapping[GpuRef, Series] = field(default_factory=dict)
    dram: Mapping[GpuRef, Series] = field(default_factory=dict)
    power: Mapping[GpuRef, Series] = field(default_factory=dict)
    power_limit: Mapping[GpuRef, float] = field(default_factory=dict)
    gpm: frozenset[GpuRef] = frozenset()
    throttle: Mapping[GpuRef, Mapping[str, Series]] = field(default_factory=dict)
    power_limits: Mapping[GpuRef, Series] = field(default_factory=dict)


#: The most nodes the fleet page's heatmap draws: 8 GPUs x 200 nodes stays readable and light
#: in a browser; a 5,000-node fleet is summarised by instance type instead (the heatmap's
#: groups). The Prometheus mode with the recording rules sends the devices of at least these
#: nodes (the least busy), whatever else it leaves to :class:`NodeSummary`.
MAX_HEATMAP_NODES = 200


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node's whole GPUs in three numbers (the ``node:`` recording rules), where the
    Prometheus mode sends no row per device: the nodes where no verdict has anything to
    show. ``gpus``: whole GPUs (a GPU in MIG mode counts once, its slices are parts of
    it). ``mean``: their mean utilization (0-1) over the window, over every GPU-minute (a
    GPU that reported for part of the window weighs by its minutes), None when none
    reported. ``known``: how many reported (the weight of ``mean`` in a fleet's mean).
    ``model``: its devices' one GPU model ("" where they have several, or none: MIG
    slices have models of their own; such nodes are sent as devices), the straggler
    groups' model of a device that has no row."""

    gpus: int
    mean: float | None
    known: int
    model: str = ""


def summary_mean(summary: NodeSummary) -> float:
    """A node's mean as the heatmap orders the nodes by it: 0 where none of its GPUs
    reported (as a node whose devices have no mean)."""
    mean = summary.mean
    return mean if mean is not None and not math.isnan(mean) else 0.0


@dataclass(frozen=True, slots=True)
class HeldSteps:
    """What the allocated-idle verdict measures a holder's use by, per step, where the store
    sends the series rather than the use itself (the embedded store): ``held``, > 0 where the
    container held its device (``container_gpu_allocated``'s highest sample in the step);
    ``utilization``, the container's highest utilization sample in the step; ``memory``, its
    processes' memory on the device (bytes, the highest sample). The device's SM activity
    and whether it has GPM are the work signals' (:class:`WorkSignals`)."""

    held: Mapping[ContainerRef, Series] = field(default_factory=dict)
    utilization: Mapping[ContainerRef, Series] = field(default_factory=dict)
    memory: Mapping[ContainerRef, Series] = field(default_factory=dict)


class HoldingKey(NamedTuple):
    """Whose devices on one node: ``namespace`` and ``workload`` (``<Kind>/<name>`` of the
    pods' top owner, "" for a pod without one); ``uuid``: a MIG slice's UUID, or "" for
    the node's whole GPUs together (a slice is priced at its share of its GPU, which only
    the page knows)."""

    node: str
    namespace: str
    workload: str
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Holding:
    """What an owner held of a node's devices over the window's steps (each step
    ``(t - step, t]`` of the window, its first point not counted): ``held``, device-seconds
    (a device held by ``n`` containers at a step counts ``1/n`` to each, the time-slice
    each holds); ``used``, device-seconds of use in the steps it held them (the
    containers' utilization, ``container_gpu_utilization_ratio``: a time-slice's holder
    may use more than its ``1/n``)."""

    held: float
    used: float = 0.0


#: A straggler group: cluster ("" in a store of one cluster: a job of one name in two
#: clusters is two runs), namespace, workload, GPU model.
GroupKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class GroupRun:
    """A straggler group the store found whole: its stragglers, one rule (``kind``:
    ``stalled`` or ``slow``, comparing ``signal``), held at every step of the history; each
    straggler's mean over those steps (``devices``) and the mean of the group's median at
    them (``median``)."""

    kind: str
    signal: str
    median: float
    devices: Mapping[GpuRef, float]


@dataclass(frozen=True, slots=True)
class Runs:
    """Findings the store summarised whole (the Prometheus mode with the recording rules):
    conditions whose per-minute flag (a recorded series) held at every step of the history,
    each with its means over those steps, instead of their steps. ``steps``: those steps'
    times (seconds since the epoch, ascending, one window step apart, the last the window's
    end). A device or container with step series of its own in :class:`FleetData` is judged
    by them; these describe the rest.

    - ``idle``: devices below the idle threshold at every step, with the signal they were
      judged by (as ``FleetData.idle_signal``), or at every step from ``idle_from``'s (the
      index in ``steps`` of the first; at no step before it);
    - ``held``: devices (idle or spinning) a container held at every step;
    - ``spinning``: devices spinning at every step (or from ``spinning_from``'s, as
      ``idle_from``), with their signals' means over those steps
      (``utilization``, and where asked ``sm``, ``tensor``, ``dram`` ratios, or
      ``power_ratio``, each minute's power over that minute's power limit, for a device
      without GPM);
    - ``held_idle``: allocated-idle containers, with the signal and its mean use (0-1), at
      every step or at every one from ``held_idle_from``'s (as ``idle_from``);
    - ``stragglers``: straggler groups described whole (:class:`GroupRun`).
    """

    steps: tuple[float, ...]
    idle: Mapping[GpuRef, str] = field(default_factory=dict)
    idle_from: Mapping[GpuRef, int] = field(default_factory=dict)
    held: frozenset[GpuRef] = frozenset()
    spinning: Mapping[GpuRef, Mapping[str, float]] = field(default_factory=dict)
    spinning_from: Mapping[GpuRef, int] = field(default_factory=dict)
    held_idle: Mapping[ContainerRef, tuple[str, float]] = field(default_factory=dict)
    held_idle_from: Mapping[ContainerRef, int] = field(default_factory=dict)
    stragglers: Mapping[GroupKey, GroupRun] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetData:
    """Everything the fleet page needs, for one window.

    - ``gpu_busy_max``: per step, the activity each device's idle verdict rests on (a step is
      idle when it is below the idle threshold). Steps at or above the threshold may be left
      out (Prometheus mode sends only idle steps): a missing step breaks an idle run either
      way. For a device that reports utilization it is the highest utilization sample in the
      step (a single busy sample makes the step busy); for a MIG slice with GPM its SM
      activity; for a MIG slice without either, 1 when a process held memory on it in the
      step and 0 when none did. ``idle_signal`` says which (``utilization``, ``sm``,
      ``process``; absent means ``utilization``).
    - ``gpu_now``: each device's highest utilization in the latest step; a device is
      reporting (has data) when it is here.
    - ``gpu_mean``: each device's mean utilization over the whole window.
    - ``gpu_step_mean``: per step, the mean device utilization (at least for devices shared by
      several containers: time-slicing starvation needs it).
    - ``allocated``: per step, 1 where a container held the device (at least for the steps in
      which the device was idle: the waste split needs no more).
    - ``containers``: per step, each container's mean utilization of each device it uses.
    - ``container_stats``: mean / stddev / count of each container's raw samples, and the
      most device memory it held, over the window.
    - ``signals``: the work signals (:class:`WorkSignals`); ``evidence``: a straggler
      cause's evidence per device (at least for the devices of workloads with a straggler
      or a slow-rank candidate), where ``read_evidence`` is None.
    - ``read_evidence``: where set, ``evidence`` is empty and this reads the evidence of
      the given nodes' devices from the store (one round of queries,
      :class:`~gpuscope.dashboard.data.source.DataError` on failure): the page asks it of
      the nodes of the straggler groups whose rows it shows, so what it reads is bounded by
      the rows shown (``views.TOP_ROWS``), not by how many workloads have stragglers.
    - ``read_spinning``: where set, the spinning runs of ``runs`` come with their
      utilization's mean alone, and this reads the means of their other signals (``sm``,
      ``tensor``, ``dram``; ``power_ratio`` without GPM) on the given nodes:
      of the devices spinning over the whole history (first argument) and of those whose
      run began within it (second): what the spinning table's rows shown display.
    - ``held_usage``: per step in which the container held its device
      (``container_gpu_allocated``), how much of what it holds it used, by
      ``held_signal`` (``sm``: its device's SM activity, when the device has GPM and it is
      the device's only holder; ``utilization``: its own utilization, the highest sample in
      the step; ``process``: 1 if it had a process on a MIG slice without GPM, else 0).
      The Prometheus mode sends only the steps below the idle threshold; the embedded
      store sends ``held_steps`` instead (:class:`HeldSteps`), from which the verdict
      measures it.
    - ``history_start``: where collected data begins (>= window start); every "for >= D"
      verdict holds over ``min(D, window, end - history_start)``.
    - ``queries``: how many backend queries this took (Prometheus mode).
    - ``silent``: the devices with nothing to judge them by now (no utilization, no GPM),
      where the data layer sends that instead of ``gpu_now`` (see :meth:`reporting`).
    - ``containers`` may hold an empty series for a container whose history no verdict
      can use (the Prometheus mode sends the history of containers on time-sliced devices
      and of the straggler candidates' workloads only): it still says who uses what.
    - ``node_summaries``: each node's :class:`NodeSummary`, where the data layer sends them
      (the Prometheus mode with the recording rules). Then ``gpus`` holds only the devices
      of the nodes a verdict, a time-sliced device or an input-starved candidate names, and
      of the :data:`MAX_HEATMAP_NODES` least busy nodes; every other node has nothing to
      flag, and its GPUs count as busy. A node's mean (the KPIs, the heatmap's order and
      groups) is its summary's wherever it has one; ``gpu_mean`` then holds the devices of
      the nodes without one, and ``read_devices`` reads the others' where they are drawn.
    - ``partial_nodes``: the nodes of which ``gpus`` holds only the devices idle or silent
      at the end, with how many whole GPUs each has (its :class:`NodeSummary`'s): the
      Prometheus mode with the recording rules sends no other device of a node that nothing
      else names (no MIG, no spinning or time-sliced device, no straggler's group, no
      input-starved candidate, no allocated-idle container on a busy device). The devices
      left out are busy.
    - ``read_devices``: reads from the store the window means of the devices of the first
      nodes given and the ``gpu_info`` of the second's (one round of queries,
      :class:`~gpuscope.dashboard.data.source.DataError` on failure): the heatmap asks it
      of the nodes it draws whose means or devices the page lacks (``partial_nodes``), so
      the page reads the cells it shows and no others.
    - ``holdings``: who held what on every node over the window (:class:`Holding`), the
      showback's allocation; every node's, the summarised ones too, whatever the namespace.
    - ``holdings_step``: how long the store counts each step in which a device was held
      in ``holdings`` (the window's step; a recorded minute with the recording rules), so
      that the showback can tell a step counted whole over a shorter history (a store
      younger than a step of a long window); None: the held time as it was.
    - ``present``: how long each node that was not there for the whole history was there
      in it (seconds, to the data's step: :func:`presence`); a node not here was there
      throughout. Each node's cost in the window is its price over this time
      (:meth:`present_seconds`): a node that came up (or went away) within the window is
      charged for the time it was there, not for the whole history.
    - ``runs``: the findings the store summarised whole (:class:`Runs`), where it does.
    - ``workloads_checked``: how many straggler groups (a workload's devices of one model)
      had two devices or more, where the data layer counts them (the Prometheus mode with
      the rules over their window: ``containers`` then holds the containers of the nodes
      that need them only); else the analysis counts them in ``containers``.
    - ``found``: where the verdicts' run records cover the window's history (the Prometheus
      mode with the rules), the idle devices, nodes and slices and the allocated-idle
      containers as the store's records give them
      (:class:`~gpuscope.dashboard.verdicts.totals.Found`; typed ``object`` here: the
      stores' model names no verdict); the views show these instead of judging steps.
    """

    window: Window
    history_start: float
    gpus: Mapping[GpuRef, GpuInfo] = field(default_factory=dict)
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    gpu_busy_max: Mapping[GpuRef, Series] = field(default_factory=dict)
    gpu_now: Mapping[GpuRef, float] = field(default_factory=dict)
    gpu_mean: Mapping[GpuRef, float] = field(default_factory=dict)
    gpu_step_mean: Mapping[GpuRef, Series] = field(default_factory=dict)
    allocated: Mapping[GpuRef, Series] = field(default_factory=dict)
    containers: Mapping[ContainerRef, Series] = field(default_factory=dict)
    container_stats: Mapping[ContainerRef, UtilStats] = field(default_factory=dict)
    pods: Mapping[PodKey, PodInfo] = field(default_factory=dict)
    idle_signal: Mapping[GpuRef, str] = field(default_factory=dict)
    signals: WorkSignals = field(default_factory=WorkSignals)
    evidence: Mapping[GpuRef, Evidence] = field(default_factory=dict)
    held_usage: Mapping[ContainerRef, Series] = field(default_factory=dict)
    held_signal: Mapping[ContainerRef, str] = field(default_factory=dict)
    held_steps: HeldSteps | None = None
    queries: int = 0
    notes: tuple[str, ...] = ()
    silent: frozenset[GpuRef] | None = None
    node_summaries: Mapping[str, NodeSummary] = field(default_factory=dict)
    workloads_checked: int | None = None
    holdings: Mapping[HoldingKey, Holding] = field(default_factory=dict)
    holdings_step: float | None = None
    present: Mapping[str, float] = field(default_factory=dict)
    runs: Runs | None = None
    partial_nodes: Mapping[str, int] = field(default_factory=dict)
    read_devices: Callable[[Collection[str], Collection[str]],
                           tuple[Mapping[GpuRef, float], Mapping[GpuRef, GpuInfo]]] | None = None
    read_evidence: Callable[[Collection[str]], Mapping[GpuRef, Evidence]] | None = None
    read_spinning: Callable[[Collection[str], Collection[str]],
                            Mapping[GpuRef, Mapping[str, float]]] | None = None
    found: object | None = None

    @property
    def history_seconds(self) -> float:
        return max(0.0, self.window.end - self.history_start)

    def present_seconds(self, node: str) -> float:
        """How long ``node`` was there in the history (:func:`seconds_there`)."""
        return seconds_there(self.present, node, self.history_seconds)

    def reporting(self) -> set[GpuRef]:
        """The devices with data now: those of ``gpus`` not ``silent`` where the data layer
        says which are silent (the Prometheus mode: it sends no per-device values for the
        busy majority), else those in ``gpu_now`` or with GPM."""
        if self.silent is not None:
            return set(self.gpus) - self.silent
        return set(self.gpu_now) | self.signals.gpm


def seconds_there(present: Mapping[str, float], node: str, history: float) -> float:
    """How long ``node`` was there in a history of ``history`` seconds: what ``present``
    (:func:`presence`) says, the whole history where it says nothing or more."""
    return min(history, present.get(node, history))


def presence(counts: Mapping[str, float], step: float, history: float) -> dict[str, float]:
    """How long each node was there in a history of ``history`` seconds (:attr:`FleetData.
    present`), from the number of steps of ``step`` seconds at which its exporter's series
    were there (``counts``): the history less the steps it missed, against the node there at
    the most steps (where the store counts a step more or less at the history's edges, it
    does so for every node). Only the nodes that missed a step: one there at every step is
    there for the whole history, to the second, and is left out."""
    if not counts or step <= 0:
        return {}
    most = max(round(c) for c in counts.values())
    return {node: max(0.0, history - (most - round(c)) * step)
            for node, c in counts.items() if round(c) < most}


@dataclass(frozen=True, slots=True)
class NodeDetail:
    """Drill-down for one node: per-device utilization and memory, per-container use, the
    work signals (SM, tensor and DRAM activity, power against its limit) and throttling.
    Keys are GPU indices (``"3"``, ``"7/1"``); ``throttle`` keys are ``"<gpu> <reason>"``."""

    node: str
    window: Window
    utilization: Mapping[str, Series] = field(default_factory=dict)     # gpu index -> series
    memory_used: Mapping[str, Series] = field(default_factory=dict)     # gpu index -> bytes
    containers: Mapping[str, Series] = field(default_factory=dict)      # "ns/pod/container gpu"
    sm: Mapping[str, Series] = field(default_factory=dict)              # ratio, rate()
    tensor: Mapping[str, Series] = field(default_factory=dict)
    dram: Mapping[str, Series] = field(default_factory=dict)
    power_ratio: Mapping[str, Series] = field(default_factory=dict)     # power / limit
    throttle: Mapping[str, Series] = field(default_factory=dict)        # seconds per second
    queries: int = 0

    @property
    def empty(self) -> bool:
        """Nothing at all about this node in the window (an unknown or long-gone node)."""
        return not any((self.utilization, self.memory_used, self.containers, self.sm,
                        self.power_ratio))


@dataclass(frozen=True, slots=True)
class PodDetail:
    """Drill-down for one pod: each container's utilization and memory per device."""

    namespace: str
    pod: str
    window: Window
    utilization: Mapping[str, Series] = field(default_factory=dict)     # "container@node/gpu"
    memory_used: Mapping[str, Series] = field(default_factory=dict)
    queries: int = 0


def index_key(index: str) -> tuple[int, ...]:
    """Sort key of a ``gpu`` label: ``"2"`` before ``"10"``, ``"7/1"`` after ``"7"``."""
    try:
        return tuple(int(p) for p in index.split("/"))
    except ValueError:
        return (1 << 30,)


@dataclass(frozen=True, slots=True)
class WorkloadDevice:
    """One device a workload's containers use, with the pods on it."""

    ref: GpuRef
    gpu: str
    model: str = ""
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadDetail:
    """Every device of one workload (one distributed run) side by side over the window:
    utilization, SM activity and power, one series per device (means per step, from the
    counters where the exporter has them). ``devices`` in node and GPU order."""

    namespace: str
    workload: str
    window: Window
    devices: tuple[WorkloadDevice, ...] = ()
    utilization: Mapping[GpuRef, Series] = field(default_factory=dict)
    sm: Mapping[GpuRef, Series] = field(default_factory=dict)
    power: Mapping[GpuRef, Series] = field(default_factory=dict)    # watts
    queries: int = 0
    total_devices: int = 0  # the workload's devices; ``devices`` holds at most a limit of them


#: The most devices a workload view draws (the stragglers first): a line per GPU stops being
#: readable long before, and a 2,000-GPU job would cost a query of 2,000 x 3 series.
MAX_WORKLOAD_DEVICES = 64


def pick_devices(devices: Sequence[WorkloadDevice], first: Collection[GpuRef],
                 limit: int = MAX_WORKLOAD_DEVICES) -> tuple[WorkloadDevice, ...]:
    """``devices`` in node and GPU order, cut to ``limit`` with those in ``first`` kept."""
    ordered = sorted(devices, key=lambda d: (d.ref.node, index_key(d.gpu), d.ref.uuid))
    if len(ordered) <= limit:
        return tuple(ordered)
    keep = [d for d in ordered if d.ref in first][:limit]
    rest = [d for d in ordered if d.ref not in first][:limit - len(keep)]
    return tuple(sorted([*keep, *rest],
                        key=lambda d: (d.ref.node, index_key(d.gpu), d.ref.uuid)))
