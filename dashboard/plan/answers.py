"""The fleet page's plan of Prometheus queries, part four: the store's answers read into the
model (:mod:`..series`): who is where, what holds at the end (:class:`Now`), the
input-starved candidates' statistics, the idle steps and the work signals. Pure: rows of
``(labels, value)`` or ``(labels, Series)`` in, the model's types out."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data.prometheus import _cref, _gref
from gpuscope.dashboard.data.promql import GROUP_CLUSTER, node_parts
from gpuscope.dashboard.plan.runs import _group_key, _workload_key
from gpuscope.dashboard.series import (
    ContainerRef,
    GpuInfo,
    GpuRef,
    GroupKey,
    NodeInfo,
    NodeSummary,
    PodInfo,
    PodKey,
    Series,
    UtilStats,
    Window,
    WorkSignals,
)

#: A workload: (cluster, namespace, workload); a job of one name in two clusters is two.
WorkloadKey = tuple[str, str, str]


@dataclass
class Now:
    """What holds at the window's end (the first round's ``now``): the idle, spinning and
    silent devices, the allocated-idle containers (and their nodes), the straggler
    candidates' workloads (``slow``: by the slow-rank rule), and with the rules the devices
    the stragglers' rules flag (at each minute of the last step), by group, and whether
    those rules are loaded at all."""

    idle: set[GpuRef] = field(default_factory=set)
    spin: set[GpuRef] = field(default_factory=set)
    silent: set[GpuRef] = field(default_factory=set)
    held_nodes: set[str] = field(default_factory=set)
    held: set[ContainerRef] = field(default_factory=set)
    judged: set[WorkloadKey] = field(default_factory=set)
    slow: set[WorkloadKey] = field(default_factory=set)
    flagged: dict[GroupKey, dict[GpuRef, str]] = field(default_factory=dict)
    straggler_rules: bool = False
    #: The index (``gpu`` label) of each idle, spinning or silent device.
    index: dict[GpuRef, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, rows: Iterable[tuple[dict[str, str], float]]) -> Now:
        out = cls()
        for lab, _ in rows:
            stat, ref = lab.get("stat", ""), _gref(lab)
            if stat in ("idle", "spin", "silent"):
                (out.idle if stat == "idle" else out.spin if stat == "spin"
                 else out.silent).add(ref)
                out.index[ref] = lab.get("gpu", "")
            elif stat == "held_idle":
                out.held_nodes.add(ref.node)
                out.held.add(_cref(lab))
            elif stat == "candidate":
                key = _workload_key(lab)
                out.judged.add(key)
                if lab.get("kind") == "slow":
                    out.slow.add(key)
            elif stat in ("stalled", "slow"):
                out.flagged.setdefault(_group_key(lab), {})[ref] = stat
            elif stat == "straggler_rules":
                out.straggler_rules = True
        return out

    def named(self) -> set[str]:
        """The nodes a finding at the end names."""
        return {g.node for g in self.idle | self.spin | self.silent | {
            g for devices in self.flagged.values() for g in devices}} | self.held_nodes


def partial_nodes(now: Now, named: Collection[str], summaries: Mapping[str, NodeSummary],
                  ) -> dict[GpuRef, GpuInfo]:
    """The devices of the nodes that only idle or silent devices at the end (and
    allocated-idle containers on those) name, of the nodes ``named`` leaves out (those
    whose devices or containers another verdict reads) and whose whole GPUs are of one
    model (:class:`NodeSummary`: no MIG slice, whose model is its own): their ``gpu_info``
    as the first round's labels and the node's model say it. Such a node's other devices
    are busy (a device idle or silent at the end is in ``now``); the page reads their
    rows only where it draws the node (``FleetData.read_devices``). A node with a spinning
    device is left out: its row shows the pods running on it."""
    known = now.idle | now.silent
    skip = {c.node for c in now.held if c.gpu not in known}  # a busy device held
    skip.update(g.node for devices in now.flagged.values() for g in devices)
    skip.update(g.node for g in now.spin)
    skip.update(named)
    index = now.index
    by_node: dict[str, list[GpuRef]] = {}
    for ref in known:
        if ref.node not in skip:
            by_node.setdefault(ref.node, []).append(ref)
    out: dict[GpuRef, GpuInfo] = {}
    for node, refs in by_node.items():
        summary = summaries.get(node)
        if summary is None or not summary.model or any(
                not index.get(r) or "/" in index[r] for r in refs):
            continue
        for r in refs:
            out[r] = GpuInfo(node, index[r], r.uuid, summary.model)
    return out


def node_infos(rows: Iterable[tuple[dict[str, str], float]]) -> dict[str, NodeInfo]:
    """``gpu_node_info`` by node (the first round's ``nodes``, less its ``stat`` rows)."""
    return {lab.get("node", ""): NodeInfo.of(lab) for lab, _ in rows if "stat" not in lab}


def bare_nodes(nodes: dict[str, NodeInfo], device_nodes: Collection[str]) -> None:
    """A Prometheus of one cluster whose exporters state it (``--cluster-name``) sees the
    cluster on ``gpu_node_info`` alone: that node's info is keyed ``cluster/node``, its
    devices (``device_nodes``) by the bare name. Such an info is made its bare node's, in
    ``nodes``."""
    for key, bare in bare_keys(nodes, device_nodes):
        nodes[bare] = replace(nodes.pop(key), node=bare)


def bare_keys(keyed: Collection[str], device_nodes: Collection[str]) -> list[tuple[str, str]]:
    """Of the node keys ``keyed`` (of a first-round answer read by node), those that name
    their cluster where the node's devices (``device_nodes``) do not, each with its bare
    key (:func:`bare_nodes`): where two keys have one bare key, the first; where the bare
    key is in ``keyed`` already, none."""
    taken = set(keyed)
    out: list[tuple[str, str]] = []
    for key in [k for k in keyed if k not in device_nodes]:
        bare = node_parts(key)[1]
        if bare != key and bare in device_nodes and bare not in taken:
            taken.add(bare)
            out.append((key, bare))
    return out


def node_presence(rows: Iterable[tuple[dict[str, str], float]], device_nodes: Collection[str],
                  ) -> dict[str, float]:
    """At how many steps each node was there (the first round's ``nodes``, its
    ``stat="present"`` rows), keyed as :func:`bare_nodes` keys the nodes: a cluster seen on
    ``gpu_node_info`` alone is left out of the key of a node whose devices have none."""
    counts = {lab.get("node", ""): v for lab, v in rows
              if lab.get("stat") == "present" and math.isfinite(v)}
    for key, bare in bare_keys(counts, device_nodes):
        counts[bare] = counts.pop(key)
    return counts


def unlabelled_note(rows: Iterable[tuple[dict[str, str], float]]) -> tuple[str, ...]:
    """The page's note where the store holds devices whose series lack the ``node`` label
    (the first round's ``nodes``, its ``stat="unlabelled"`` row: how many whole GPUs'
    ``gpu_info`` series in the window): the page cannot place them on a node, so they are
    not on it."""
    count = next((v for lab, v in rows if lab.get("stat") == "unlabelled"
                  and math.isfinite(v) and v > 0), 0.0)
    if not count:
        return ()
    one = round(count) == 1
    return (f"{round(count):,} GPU{'' if one else 's'} in the store "
            f"{'has' if one else 'have'} no node label (gpu_info without `node`) and "
            f"{'is' if one else 'are'} not on this page: add the label in the scrape config "
            "from the pod's node name, as the shipped ServiceMonitor, PodMonitor and "
            "deploy/prometheus/scrape-config.yaml do (docs/dashboard.md).",)


def lag_note(rows: Iterable[tuple[dict[str, str], float]], window: Window,
             reach: float, now: float, far: float | None = None) -> tuple[str, ...]:
    """The page's note where the store's newest exporter sample (the first round's
    ``nodes``, its ``stat="newest"`` rows, one per cluster) is older than the dashboard's
    clock (``now``) by more than a step's queries look back (``reach``: the step, at least
    the store's lookback): the dashboard's clock ahead of the store's, or data that reaches
    the store late (remote write, a managed store's ingestion, a backlog after an outage).
    The page is served that many steps earlier (:meth:`~gpuscope.dashboard.plan.served.
    ServedStore.served_window`), so the note says where it ends; where it could not be (the
    store's answer older than the window's end by more than ``reach`` still), that the
    verdicts which need a point at the last step are missing. ``far``: the newest sample
    that placed the page where the store had none within its lookback of the clock (the
    rows have none then). Where some clusters' newest samples are beyond ``reach`` of the
    page's end and others' are not, the note names them: their nodes have no point at the
    page's last step. A cluster with no ``newest`` row (no sample within the store's
    lookback of the clock) is named from its ``stat="seen"`` row (its newest sample within
    the hour before), where another cluster has one."""
    rows = list(rows)
    newest_of = {lab.get(GROUP_CLUSTER, ""): v for lab, v in rows
                 if lab.get("stat") == "newest" and math.isfinite(v)}
    if newest_of:
        newest_of = {**{lab.get(GROUP_CLUSTER, ""): v for lab, v in rows
                        if lab.get("stat") == "seen" and math.isfinite(v)}, **newest_of}
    newest = max(newest_of.values(), default=far)
    if newest is None:
        return ()
    why = ("Is the store's clock behind, or does data reach it late (remote write, a managed "
           "store's ingestion)?")
    if window.end - newest > reach:
        return (f"The store's newest exporter sample is {fmt.duration(window.end - newest)} "
                f"older than this page's end ({fmt.clock(window.end)}, the dashboard's clock):"
                f" verdicts that need a point at the last step are missing. {why}",)
    out: tuple[str, ...] = ()
    if now - newest > reach and window.end <= now - window.step:
        out = (f"The store's newest exporter sample is {fmt.duration(now - newest)} older "
               f"than the dashboard's clock ({fmt.clock(now)}): this page ends at "
               f"{fmt.clock(window.end)}, where the store has data. {why}",)
    late = sorted((c for c, v in newest_of.items() if window.end - v > reach),
                  key=lambda c: newest_of[c])
    if late:
        shown = ", ".join(f"{c or '(no cluster label)'} ({fmt.duration(window.end - newest_of[c])}"
                          " behind)" for c in late[:5])
        more = f" and {len(late) - 5} more" if len(late) > 5 else ""
        one = len(late) == 1
        out += (f"Cluster{'' if one else 's'} {shown}{more}: {'its' if one else 'their'} "
                f"newest exporter sample{'' if one else 's are'}{' is' if one else ''} older "
                f"than this page's end ({fmt.clock(window.end)}) by more than a step's "
                f"queries look back, so {'its' if one else 'their'} nodes' verdicts that need "
                f"a point at the last step are missing. Is {'that cluster' if one else 'each'}'s "
                "Prometheus or its remote write behind?",)
    return out


def pod_infos(rows: Iterable[tuple[dict[str, str], float]]) -> dict[PodKey, PodInfo]:
    """``gpu_pod_info`` by pod."""
    pods = (PodInfo.of(lab) for lab, _ in rows)
    return {pod.key: pod for pod in pods}


def gpu_infos(rows: Iterable[tuple[dict[str, str], float]]) -> dict[GpuRef, GpuInfo]:
    """``gpu_info`` by device."""
    gpus = (GpuInfo.of(lab) for lab, _ in rows)
    return {info.ref: info for info in gpus}


def util_stats(rows: Iterable[tuple[dict[str, str], float]],
               mean: Mapping[ContainerRef, float]) -> dict[ContainerRef, UtilStats]:
    """The input-starved candidates' statistics (``stats``: stddev, count, memory, by
    ``stat``), each with its raw ``mean`` (the first round's ``members``: the same
    expression); a container without a mean is left out."""
    parts: dict[ContainerRef, dict[str, float]] = {}
    for lab, v in rows:
        parts.setdefault(_cref(lab), {})[lab.get("stat", "")] = v
    return {
        ref: UtilStats(
            mean=mean[ref], stddev=p.get("stddev", 0.0),
            samples=int(p.get("count", 0)), memory_bytes=p.get("memory", 0.0),
        )
        for ref, p in parts.items() if ref in mean
    }


def idle_steps(rows: Iterable[tuple[dict[str, str], Series]],
               ) -> tuple[dict[GpuRef, Series], dict[GpuRef, str]]:
    """Each device's idle steps (``idle_steps``) and the signal they were judged by."""
    busy_max: dict[GpuRef, Series] = {}
    signal: dict[GpuRef, str] = {}
    for lab, s in rows:
        ref = _gref(lab)
        busy_max[ref] = s
        signal[ref] = lab.get("signal", "utilization")
    return busy_max, signal


def work_signals_of(rows: Iterable[tuple[dict[str, str], Series]],
                 apart: Collection[GpuRef] = ()) -> WorkSignals:
    """The spinning devices' and slow-rank candidates' signals per step, by ``signal``
    (``limit``: the power limit, per step and its last value), but of the devices
    ``apart`` (those of the straggler groups the store summarised whole)."""
    by_signal: dict[str, dict[GpuRef, Series]] = {}
    for lab, s in rows:
        if _gref(lab) not in apart:
            by_signal.setdefault(lab.get("signal", ""), {})[_gref(lab)] = s
    steps = {ref: s for ref, s in by_signal.pop("limit", {}).items() if s.values}
    return WorkSignals(
        utilization=by_signal.get("utilization", {}), sm=by_signal.get("sm", {}),
        tensor=by_signal.get("tensor", {}), dram=by_signal.get("dram", {}),
        power=by_signal.get("power", {}),
        power_limit={ref: s.values[-1] for ref, s in steps.items()},
        gpm=frozenset(by_signal.get("sm", {})), power_limits=steps,
    )
