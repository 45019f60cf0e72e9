"""The fleet page's second round of queries (:meth:`.queries.PlanQueries.second_round`): the
history of what the first round singled out, asked by node (``node=~`` lists; a query is at
most :data:`~gpuscope.dashboard.data.prometheus.MAX_QUERY_BYTES`, a longer list is split over
queries named ``role#1``, ``role#2``...), one function per part: the idle and held-idle
steps, the time-sliced devices and the straggler candidates' containers, the work signals,
the input-starved candidates' statistics and the stragglers' evidence."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial

from gpuscope.dashboard.data.prometheus import EDGE, _split
from gpuscope.dashboard.data.promql import (
    any_of,
    duration,
    labelled,
    node_matchers,
    selector,
)
from gpuscope.dashboard.data.recorded import (
    CBY,
    GBY,
    NOT_EMPTY,
    RULE_INTERVAL,
    RULES,
    Steps,
)
from gpuscope.dashboard.plan.runs import FollowUp
from gpuscope.dashboard.series import Window
from gpuscope.dashboard.verdicts import Thresholds, allocated, idle, stragglers


def step_minutes(window: Window) -> int:
    """The recorded minutes in one of ``window``'s steps (at least one)."""
    return max(1, round(window.step / RULE_INTERVAL))


def every_minute(rec: str, by: str, fn: str, r: str, minutes: int) -> str:
    """The sparse recorded series ``rec`` (a selector) over a step's range ``r`` (``fn``,
    aggregated ``by``) where it has a sample at each of the step's ``minutes``: a step of
    several minutes meets a recorded rule where each of its minutes did."""
    return (f"max by ({by}) ({fn}({rec}[{r}])) and on ({by})"
            f" (count_over_time({rec}[{r}]) >= {minutes})")


@dataclass
class Round:
    """The second round's queries as they are built (``out``, by name), over ``window``'s
    steps (``r``: a step's range, ``rr``: a rate's) from the raw series or the recording
    rules (``rules``)."""

    window: Window
    r: str
    rr: str
    rules: bool
    cluster_label: str
    thresholds: Thresholds
    namespace: str | None = None
    out: dict[str, str] = field(default_factory=dict)

    def each(self, role: str, nodes: Collection[str], build: Callable[[Steps], str],
             label: str = "node") -> None:
        """``build``'s query of ``nodes`` (by ``label``: a node key's matchers, else a
        regex of the values), split into lists under the query limit."""
        for i, q in enumerate(_split(sorted(set(nodes)), lambda names: build(
                Steps(self.r, self.rr, self.rules, node_matchers(names, self.cluster_label)
                      if label == "node" else {label: f'=~"{any_of(names)}"'})))):
            self.out[role if i == 0 else f"{role}#{i}"] = q


def second_round(rnd: Round, ask: FollowUp, by_node: bool = False) -> dict[str, str]:
    """Every part of the round that ``ask`` names (:meth:`.queries.PlanQueries.
    second_round`), into ``rnd.out``, which it returns."""
    _idle_and_held(rnd, ask, by_node)
    rnd.each("allocated", ask.idle_nodes, lambda st: (
        f"max by (node, uuid) (max_over_time("
        f"{st.sel('container_gpu_allocated', {'namespace': NOT_EMPTY})}[{rnd.r}]))"))
    _shared_and_candidates(rnd, ask)
    _work_signals(rnd, ask)
    # By pod name, not node: the candidates' own series only (1,400 of the 29,000
    # containers at 5,000 nodes, on 1,100 nodes holding 12,000 others; the few other
    # containers of their pods, not candidates, are left out by the analysis' own test
    # of the mean): 0.21-0.26 s of the store's time instead of 0.52-0.61 s.
    rnd.each("stats", ask.input, partial(_stats, rnd), "pod")
    if ask.evidence_seconds > 0:
        _evidence(rnd, ask)
    return rnd.out


def _idle_and_held(rnd: Round, ask: FollowUp, by_node: bool) -> None:
    """The idle devices' and the held-idle containers' steps: with the rules the recorded
    sparse series themselves, asked without a list (they hold only what meets the rule), or
    (``by_node``: the few findings the run summaries could not summarise) by node."""
    if not rnd.rules:
        th = rnd.thresholds
        rnd.each("idle_steps", ask.idle, lambda st: " or ".join(idle.idle_promql(st, th)))
        rnd.each("held_idle", ask.held,
                 lambda st: " or ".join(allocated.held_idle_promql(st, th)))
        return
    # Every minute of the step met the rule (a step of several minutes).
    minutes = step_minutes(rnd.window)

    def sparse(st: Steps, key: str, by: str, fn: str) -> str:
        return every_minute(st.sel(RULES[key]), by, fn, rnd.r, minutes)

    for role, key, nodes, by, fn in (
            ("idle_steps", "idle", ask.idle, f"{GBY}, signal", "max_over_time"),
            ("held_idle", "held_idle", ask.held, f"{CBY}, signal", "avg_over_time")):
        if not nodes:
            continue
        if by_node:
            rnd.each(role, nodes, partial(sparse, key=key, by=by, fn=fn))
        else:
            rnd.out[role] = sparse(Steps(rnd.r, rnd.rr, rnd.rules), key, by, fn)


def _shared_and_candidates(rnd: Round, ask: FollowUp) -> None:
    """The time-sliced devices' steps and their containers', and every container of the
    straggler candidates' nodes (a straggler group's devices)."""
    w = duration(rnd.window.seconds)
    at = f"{rnd.window.end:.3f}"
    # The time-sliced devices by uuid where the first round's ``members`` name them,
    # else by node: then their nodes' other devices and containers are not read.
    shared, by = (ask.shared_devices, "uuid") if ask.shared_devices else (ask.shared, "node")

    def shared_only(st: Steps) -> str:
        """Asked by node: the devices two containers or more used in the window (the
        first round's ``members``' sharing, read once at its end: ``@``), so that of a
        node with one time-sliced device its other devices' steps are not sent. Asked
        by uuid: those devices are the ones listed."""
        if by == "uuid":
            return ""
        cutil = st.sel("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})
        return (f" and on (node, uuid) (count by (node, uuid)"
                f" (last_over_time({cutil}[{w}] @ {at})) >= 2)")

    rnd.each("shared", shared, lambda st: (
        f"max by ({GBY}) (avg_over_time({st.sel('gpu_utilization_ratio')}[{rnd.r}]))"
        + shared_only(st)), by)

    def containers(st: Steps, only_shared: bool = False) -> str:
        steps = st.cutil() + (shared_only(st) if only_shared else "")
        if rnd.namespace is None:
            return steps
        mine = selector("container_gpu_utilization_ratio", st.match, namespace=rnd.namespace)
        return (f"{steps} and on (node, uuid)"
                f" max by (node, uuid) (max_over_time({mine}[{rnd.r}]))")

    # (Two roles: a node in both lists has its time-sliced devices' containers in each.)
    rnd.each("containers", ask.candidates, containers)
    rnd.each("shared_containers", shared, partial(containers, only_shared=True), by)


def _work_signals(rnd: Round, ask: FollowUp) -> None:
    """The spinning devices' work signals, and the slow-rank candidates' workloads'."""
    r, at = rnd.r, f"{rnd.window.end:.3f}"

    def signal(expr: str, name: str) -> str:
        return labelled(expr, "signal", name)

    def spinning(st: Steps) -> str:
        # With the rules, only the devices spinning at the end (of the nodes listed,
        # read once: ``@``); without, every device of those nodes (the rule written out
        # in each signal's filter would make the query too long for VictoriaMetrics).
        # Power and its limit only where there is no GPM (the rule's fallback).
        now = (f" and on (node, uuid) last_over_time({st.sel(RULES['spin'])}[{r}] @ {at})"
               if rnd.rules else "")
        gpm = st.sel("gpu_sm_active_seconds_total")
        return " or ".join(
            f"{signal(expr, name)}{now}" for name, expr in (
                ("utilization", st.util()), ("sm", st.active("sm")),
                ("tensor", st.active("tensor")), ("dram", st.active("dram")),
                ("power", f"{st.power()} unless on (node, uuid) {gpm}"),
                ("limit", f"{st.limit()} unless on (node, uuid) {gpm}")))

    def workload_signals(st: Steps) -> str:
        gpm = st.sel("gpu_sm_active_seconds_total")
        return " or ".join(signal(expr, name) for name, expr in (
            ("utilization", st.util()), ("sm", st.active("sm")),
            ("power", f"{st.power()} unless on (node, uuid) {gpm}"),
            ("limit", f"{st.limit()} unless on (node, uuid) {gpm}")))

    rnd.each("spinning", ask.spinning, spinning)
    rnd.each("workload_signals", ask.slow, workload_signals)


def _stats(rnd: Round, st: Steps) -> str:
    """The input-starved candidates' raw-sample statistics over the window (stddev, count,
    memory; the mean is the first round's ``members``), of the namespace filtered to."""
    w = duration(rnd.window.seconds)
    namespace = rnd.namespace
    ns = {"namespace": NOT_EMPTY} if namespace is None else {}
    eq = {} if namespace is None else {"namespace": namespace}
    util = selector("container_gpu_utilization_ratio", {**st.match, **ns}, **eq)
    mem = selector("container_gpu_memory_used_bytes", {**st.match, **ns}, **eq)
    return " or ".join(
        labelled(expr, "stat", name) for name, expr in (
            ("stddev", f"avg by ({CBY}) (stddev_over_time({util}[{w}]))"),
            ("count", f"max by ({CBY}) (count_over_time({util}[{w}]))"),
            ("memory", f"max by ({CBY}) (max_over_time({mem}[{w}]))")))


def _evidence(rnd: Round, ask: FollowUp) -> None:
    """The stragglers' evidence on ``ask.evidence`` (None: the candidates' nodes) over the
    last ``ask.evidence_seconds``: throttling, SM clock and temperature."""
    d = duration(ask.evidence_seconds)
    evidence = ask.candidates if ask.evidence is None else ask.evidence
    # Throttling over the last ``d``: the counters' rate, or with the rules the mean of the
    # recorded minutes where it was above 0 (absent minutes count 0; each minute's value is
    # the rate over two): 11 reasons' counters per device are 90 % of the evidence's cost in
    # the store (0.8 s at 5,000 nodes), the sparse series almost nothing.
    minutes = max(1, round(ask.evidence_seconds / RULE_INTERVAL))
    dm = duration(minutes * RULE_INTERVAL - EDGE)

    def throttling(st: Steps) -> str:
        if st.rules:
            return (f"max by ({GBY}, reason) (sum_over_time("
                    f"{st.sel(RULES['throttling'])}[{dm}])) / {minutes}")
        return stragglers.throttling_promql(st, d)

    rnd.each("evidence", evidence, lambda st: " or ".join([
        f'label_replace({throttling(st)}, "stat", "throttle", "", "")',
        f'label_replace(max by ({GBY}) (avg_over_time('
        f'{st.sel("gpu_sm_clock_hertz")}[{d}])), "stat", "sm_clock", "", "")',
        f'label_replace(max by ({GBY}) (avg_over_time('
        f'{st.sel("gpu_temperature_celsius")}[{d}])), "stat", "temperature", "", "")',
    ]))
