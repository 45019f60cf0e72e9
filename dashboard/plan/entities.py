"""The fleet page's numbers per entity from the verdicts' run records
(:mod:`~gpuscope.dashboard.verdicts.runs`): each node's whole GPUs by state, each idle
node's numbers, the nodes with MIG slices, each allocated-idle container's price share
(:func:`entity_queries`, :func:`entities_of`): one instant query per table at the page's
end, the same whatever the fleet's state, a number or a few per entity; the page prices,
sums and ranks them (:mod:`~gpuscope.dashboard.verdicts.totals`). And the idle verdicts of
some nodes' devices from their runs (:func:`devices_of`): the nodes the numbers leave
open, and those whose rows the page shows.

A verdict holds where its run is at least its required time: ``since <= end - required +
a minute`` (a run starts a minute before its first flagged minute). The history's benefit
(a run that began with its data within two steps of the history's start holds from it) is
not counted here: :func:`bounded` says whether the page's history is long enough for it
not to matter.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from gpuscope.dashboard.data.prometheus import MAX_QUERY_BYTES, _split
from gpuscope.dashboard.data.promql import node_matchers
from gpuscope.dashboard.data.recorded import (
    CBY,
    GBY,
    RULE_INTERVAL,
    RULE_R,
    RULES,
)
from gpuscope.dashboard.plan.rules import _stat
from gpuscope.dashboard.series import ContainerRef, GpuInfo, GpuRef, Window
from gpuscope.dashboard.verdicts import Thresholds, allocated, idle, spinning
from gpuscope.dashboard.verdicts.allocated import AllocatedIdle
from gpuscope.dashboard.verdicts.common import EPSILON, required_seconds
from gpuscope.dashboard.verdicts.runs import Instant, read_runs
from gpuscope.dashboard.verdicts.totals import Devices, Entities, States

#: A node's MIG slices, seen in the last minute (a failed scrape's staleness marker at the
#: end hides them).
SLICES = f'count by (node) (max_over_time(gpu_info{{parent_uuid!=""}}[{RULE_R}]))'
#: The nodes without MIG slices (appended to a query ``by (node)``).
NO_MIG = f" unless on (node) {SLICES}"
#: The NodeRun stats read at the history's start too (where every run began by then).
THEN = ("gpus", "since_sum", "held_sum", "spun_sum")


def _last(key: str, by: str, at: str = "") -> str:
    return f"max by ({by}) (last_over_time({RULES[key]}[{RULE_R}]{at}))"


def holding(key: str, by: str, window: Window, history_start: float,
            duration: float) -> str:
    """The runs of ``key`` (a ``..._since`` record) that hold ``duration`` on a page of
    ``window`` whose history starts at ``history_start``, each its first minute."""
    latest = window.end - required_seconds(duration, window, history_start) \
        + RULE_INTERVAL + EPSILON
    return f"({_last(key, by)} <= {latest!r})"


def bounded(window: Window, history_start: float, th: Thresholds) -> bool:
    """Whether the run records give this page's verdicts without the history's benefit:
    each verdict's required time is shorter than the history less two steps (a run that
    began within two steps of its start holds anyway)."""
    longest = max(th.idle_duration, th.spin_duration, th.allocated_idle_duration,
                  th.straggler_duration)
    return required_seconds(longest, window, history_start) \
        <= window.end - history_start - 2 * window.step - RULE_INTERVAL


def entity_queries(window: Window, history_start: float, th: Thresholds) -> dict[str, str]:
    """The queries of :func:`entities_of`, by role (``entities#i``: one per table)."""
    idle_hold = holding("idle_run_since", GBY, window, history_start, th.idle_duration)
    spin_hold = holding("spin_run_since", GBY, window, history_start, th.spin_duration)
    alloc_hold = holding("alloc_run_since", CBY, window, history_start,
                         th.allocated_idle_duration)
    then = f" @ {history_start:.3f}"
    parts = [
        " or ".join([
            _stat(f"count by (node) ({idle_hold} unless on (node, uuid) {spin_hold})"
                  f"{NO_MIG}", "idle"),
            _stat(f"count by (node) ({spin_hold}){NO_MIG}", "spinning"),
            _stat(f"count by (node) ({_last('silent', GBY)}){NO_MIG}", "no_data"),
            _stat(SLICES, "mig"),
        ]),
        " or ".join([*(_stat(_last(f"node_idle_{s}", "node"), s)
                       for s in idle.NODE_RUN_STATS),
                     *(_stat(_last(f"node_idle_{s}", "node", then), f"{s}_then")
                       for s in THEN)]),
        _stat(f"{_last('alloc_share', CBY)} and on ({CBY}) {alloc_hold}", "share"),
    ]
    return {f"entities#{i}" if i else "entities": q for i, q in enumerate(parts)}


def entities_of(rows: Iterable[tuple[Mapping[str, str], float]]) -> Entities:
    """:class:`Entities` from the answers to :func:`entity_queries`."""
    states: dict[str, list[int]] = {}
    numbers: dict[str, dict[str, float]] = {}
    mig: set[str] = set()
    allocated: dict[ContainerRef, float] = {}
    order = ("idle", "spinning", "no_data")
    for lab, v in rows:
        stat, node = lab.get("stat", ""), lab.get("node", "")
        if stat in order:
            states.setdefault(node, [0, 0, 0])[order.index(stat)] = round(v)
        elif stat == "mig":
            mig.add(node)
        elif stat == "share":
            allocated[ContainerRef(node, lab.get("namespace", ""), lab.get("pod", ""),
                                   lab.get("container", ""), lab.get("uuid", ""))] = v
        elif stat:
            numbers.setdefault(node, {})[stat] = v
    runs = {}
    for node, n in numbers.items():
        if "gpus" not in n or node in mig:
            continue
        # The same runs at the history's start (the same GPUs, the same first minutes):
        # their sums then are the part before it.
        same = all(n.get(f"{s}_then") == n.get(s) for s in ("gpus", "since_sum"))
        runs[node] = idle.NodeRun(
            round(n["gpus"]), n["since_max"], n["since_min"], n["since_sum"],
            n.get("held_sum", 0.0), n.get("spun_sum", 0.0),
            (n.get("held_sum_then", 0.0), n.get("spun_sum_then", 0.0)) if same else None)
    return Entities(
        states={n: States(*s) for n, s in states.items() if n not in mig},
        node_runs=runs, mig_nodes=frozenset(mig), allocated=allocated,
    )




def devices_of(instant: Instant, window: Window, history_start: float,
               nodes: Collection[str], gpus: Mapping[GpuRef, GpuInfo], th: Thresholds,
               cluster_label: str = "cluster") -> Devices:
    """The idle verdicts of ``nodes``' devices (``gpus``: every device of theirs, the
    inventory; may be given later, :func:`with_gpus`) from their idle and spinning runs
    (:func:`~.idle.gpu_idle_of`, :func:`~.spinning.spinning_of` holding), and which have no
    data. The nodes in lists short enough for the store (``node=~``)."""
    def matcher(names: Sequence[str]) -> str:
        return "{" + ", ".join(f"{k}{v}" for k, v in node_matchers(
            names, cluster_label).items()) + "}"

    out = Devices()
    # (Room for the rest of the longest query: the fresh runs' check names it once.)
    for match in _split(sorted(nodes), matcher, MAX_QUERY_BYTES - 2_000):
        out = merged(out, _devices(instant, window, history_start, match, th))
    return with_gpus(out, nodes, gpus)


def _devices(instant: Instant, window: Window, history_start: float, match: str,
             th: Thresholds) -> Devices:
    idle_runs = read_runs(instant, idle.run_rule(), window.end, history_start, window.step,
                          match)
    signal = {(lab.get("node", ""), lab.get("uuid", "")): lab.get("signal", "")
              for lab, _ in instant(f"max by ({GBY}, signal) (last_over_time("
                                    f"{RULES['idle']}{match}[{RULE_R}]))", window.end)}
    verdicts = {}
    for (node, _, uuid), run in idle_runs.items():
        ref = GpuRef(node, uuid)
        verdicts[ref] = idle.gpu_idle_of(ref, run, window, history_start,
                                         signal=signal.get((node, uuid)) or "utilization",
                                         duration=th.idle_duration)
    spins = set()
    for (node, _, uuid), run in read_runs(instant, spinning.run_rule(), window.end,
                                          history_start, window.step, match).items():
        ref = GpuRef(node, uuid)
        if spinning.spinning_of(ref, run, window, history_start, gpm=False,
                                duration=th.spin_duration).spinning:
            spins.add(ref)
    silent = {GpuRef(lab.get("node", ""), lab.get("uuid", "")) for lab, _ in instant(
        f"max by (node, uuid) (last_over_time({RULES['silent']}{match}[{RULE_R}]))",
        window.end)}
    return Devices({}, verdicts, frozenset(spins), frozenset(silent))


def allocated_of(instant: Instant, window: Window, history_start: float,
                 th: Thresholds) -> tuple[AllocatedIdle, ...]:
    """Every allocated-idle container's finding that holds, from its recorded run
    (:func:`~.allocated.allocated_idle_of`), with the signal its use was measured by."""
    runs = read_runs(instant, allocated.run_rule(), window.end, history_start, window.step)
    keys = tuple(k.strip() for k in CBY.split(","))
    signal = {tuple(lab.get(k, "") for k in keys): lab.get("signal", "")
              for lab, _ in instant(f"max by ({CBY}, signal) (last_over_time("
                                    f"{RULES['held_idle']}[{RULE_R}]))", window.end)}
    out = []
    for key, run in runs.items():
        found = allocated.allocated_idle_of(
            ContainerRef(*key), run, window, history_start,
            signal=signal.get(key) or "utilization", duration=th.allocated_idle_duration)
        if found is not None:
            out.append(found)
    out.sort(key=lambda a: (a.ref.node, a.ref.namespace, a.ref.pod, a.ref.container,
                            a.ref.uuid))
    return tuple(out)


def with_gpus(devices: Devices, nodes: Collection[str], gpus: Mapping[GpuRef, GpuInfo],
              ) -> Devices:
    """``devices`` of ``nodes`` with their inventory from ``gpus``."""
    on = set(nodes)
    return replace(devices, gpus={ref: info for ref, info in gpus.items() if ref.node in on})


def merged(a: Devices, b: Devices) -> Devices:
    """The devices of both (of different nodes)."""
    return Devices({**a.gpus, **b.gpus}, {**a.idle, **b.idle}, a.spinning | b.spinning,
                   a.silent | b.silent)
