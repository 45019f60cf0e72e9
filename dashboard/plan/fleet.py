"""The fleet page's data from a Prometheus-compatible store: :class:`PrometheusData` runs
the plan's rounds of queries (:mod:`.queries`) and reads their answers into
:class:`~gpuscope.dashboard.series.FleetData` for the verdicts judged in the views (idle
GPUs, nodes and slices, spinning, allocated-idle, starvation, stragglers); the registry's
own verdicts are asked beside it, as step queries."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from gpuscope.dashboard.data.prometheus import _cref, _gref
from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.data.recorded import RULE_INTERVAL
from gpuscope.dashboard.data.source import (
    validate_namespace,
)
from gpuscope.dashboard.plan.answers import (
    Now,
    WorkloadKey,
    bare_nodes,
    gpu_infos,
    idle_steps,
    lag_note,
    node_infos,
    node_presence,
    partial_nodes,
    pod_infos,
    unlabelled_note,
    util_stats,
    work_signals_of,
)
from gpuscope.dashboard.plan.entities import (
    allocated_of,
    bounded,
    devices_of,
    entities_of,
    entity_queries,
    with_gpus,
)
from gpuscope.dashboard.plan.queries import PlanQueries
from gpuscope.dashboard.plan.rules import RAW_NODES, raw_note
from gpuscope.dashboard.plan.runs import (
    _NO_POINTS,
    FollowUp,
    _Answers,
    _evidence,
    _FullRuns,
    _groups,
    _merge_signals,
    _StragglerRuns,
    _summaries,
    detail_nodes,
)
from gpuscope.dashboard.series import (
    ContainerRef,
    Evidence,
    FleetData,
    GpuInfo,
    GpuRef,
    GroupKey,
    Holding,
    HoldingKey,
    NodeInfo,
    NodeSummary,
    PodInfo,
    PodKey,
    Runs,
    Series,
    Window,
    gc_paused,
    presence,
)
from gpuscope.dashboard.verdicts import Thresholds
from gpuscope.dashboard.verdicts.allocated import AllocatedIdle
from gpuscope.dashboard.verdicts.idle import NodeIdle, idle_nodes
from gpuscope.dashboard.verdicts.totals import (
    FIRST_ROWS,
    Devices,
    Entities,
    Found,
    allocated_nodes,
    fleet_totals,
    shown_nodes,
)


def _holdings(rows: list[tuple[dict[str, str], float]]) -> dict[HoldingKey, Holding]:
    """:meth:`PlanQueries.holdings_queries`' answers, by owner."""
    sums: dict[HoldingKey, list[float]] = {}
    for lab, value in rows:
        if not math.isfinite(value):
            continue
        key = HoldingKey(lab.get("node", ""), lab.get("namespace", ""),
                         lab.get("workload", ""), lab.get("uuid", ""))
        sums.setdefault(key, [0.0, 0.0])[lab.get("stat") == "used"] += value
    return {k: Holding(held, used) for k, (held, used) in sums.items()}


#: The run records' reads sent beside the detail round: the devices' runs, and every
#: allocated-idle container's finding.
_Pending = tuple[Future[Devices], Future[tuple[AllocatedIdle, ...]]]


@dataclass(frozen=True)
class _Users:
    """Who used which device over the window (the ``members`` answer: each container's
    raw mean), and what it tells the second round."""

    mean: dict[ContainerRef, float]
    #: The input-starved candidates' pods: a raw mean in the rule's range (of the namespace
    #: filtered to: the other containers on its devices are there for time-slicing).
    input_pods: set[str]
    #: The devices two containers or more used (time-sliced).
    shared: set[GpuRef]
    #: The nodes each workload ran on, by (cluster, namespace, workload).
    workload_nodes: dict[WorkloadKey, set[str]]

    @property
    def members(self) -> list[ContainerRef]:
        """The containers, in the answer's order."""
        return list(self.mean)

    @classmethod
    def of(cls, rows: list[tuple[dict[str, str], float]], pods: Mapping[PodKey, PodInfo],
           namespace: str | None, th: Thresholds) -> _Users:
        mean = {_cref(lab): v for lab, v in rows if lab.get("namespace")}
        input_pods = {
            lab.get("pod", "") for lab, m in rows
            if lab.get("namespace") and th.input_low <= m <= th.input_high
            and (namespace is None or lab.get("namespace") == namespace)}
        sharers: dict[GpuRef, int] = {}
        workload_nodes: dict[WorkloadKey, set[str]] = {}
        for c in mean:
            gpu = c.gpu
            sharers[gpu] = sharers.get(gpu, 0) + 1
            pod = pods.get(c.pod_key)
            if pod is not None and pod.workload:
                workload_nodes.setdefault((node_parts(c.node)[0], c.namespace, pod.workload),
                                          set()).add(c.node)
        return cls(mean, input_pods, {g for g, n in sharers.items() if n >= 2},
                   workload_nodes)

    def follow_up(self, now: Now) -> FollowUp:
        """What the second round asks of the nodes and pods the first one singled out
        (``idle_nodes``: added where the summaries are not used)."""
        nodes_of = self.workload_nodes
        return FollowUp(
            idle={g.node for g in now.idle},
            shared={g.node for g in self.shared},
            shared_devices={g.uuid for g in self.shared},
            spinning={g.node for g in now.spin},
            held=now.held_nodes,
            candidates={n for k in now.judged for n in nodes_of.get(k, ())},
            slow={n for k in now.slow for n in nodes_of.get(k, ())},
            input=self.input_pods,
        )


@dataclass(frozen=True)
class _Trail:
    """The run summaries as :meth:`PrometheusData._summary_round` read them: their rows,
    the findings they hold whole, and the trailing ones' answers (None: none asked)."""

    rows: list[tuple[dict[str, str], float]]
    runs: _FullRuns
    answers: _Answers | None
    steps: int
    minutes: int


@dataclass(frozen=True)
class _Whole:
    """What :meth:`PrometheusData._whole_round` gives the page: the stragglers' groups
    held whole (their containers, with no steps, and their devices), the third round's
    queries and answers, and the findings for the verdicts."""

    containers: dict[ContainerRef, Series]
    devices: set[GpuRef]
    extra: dict[str, str]
    answers: _Answers | None
    summary: Runs


def _idle_nodes_now(gpus: Mapping[GpuRef, GpuInfo], now: Now) -> set[str]:
    """The nodes idle at the end: every whole GPU, or every slice of one in MIG mode,
    idle or spinning (``now``)."""
    slices_of: dict[GpuRef, list[GpuRef]] = {}
    for info in gpus.values():
        if not info.is_physical:
            slices_of.setdefault(GpuRef(info.node, info.parent_uuid), []).append(info.ref)
    node_idle: dict[str, bool] = {}
    for info in gpus.values():
        if info.is_physical:
            parts = slices_of.get(info.ref) or [info.ref]
            node_idle[info.node] = node_idle.get(info.node, True) and all(
                p in now.idle or p in now.spin for p in parts)
    return {n for n, idle in node_idle.items() if idle}


class PrometheusData(PlanQueries):
    """The fleet page's data source on a Prometheus-compatible store (``--prometheus``):
    the store's queries and drill-downs (:class:`~gpuscope.dashboard.data.prometheus.
    PrometheusStore`), the fleet page from the plan (:meth:`fleet`), and the registry's
    step queries in their recorded form where the rules are loaded."""

    #: How many of each table's rows (dearest first) the page reads the findings of with
    #: the run records (the rest when shown).
    first_rows = FIRST_ROWS

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        """The fleet page's data: the rounds of queries of :meth:`fleet_queries`,
        :meth:`second_round` and :meth:`run_queries` (``docs/dashboard.md``), with the
        cyclic garbage collector held off (:func:`gc_paused`). With the recording rules,
        between the first two: :meth:`summary_queries` (each node's numbers, and over the
        default hour who uses what) and :meth:`detail_queries` (the devices and containers
        of the nodes that need them, :func:`detail_nodes`). Over the window :meth:`served`
        gives (a step earlier where the rules have not recorded its last minute yet)."""
        if namespace is not None:  # (before any query)
            namespace = validate_namespace(namespace)
        with gc_paused():
            served, asked = self.served_window(window or self.window(window_seconds))
            return self._fleet(served, namespace, asked=asked)

    def _fleet(self, window: Window, namespace: str | None, records: bool = True,
               asked: int = 0) -> FleetData:
        rules, checks = self._check_rules(window)
        checks += asked
        th = self.thresholds
        assumed = self.assumed_start(window)
        recorded, checked = self._records_cover(window, namespace, rules, assumed, records)
        checks += checked
        queries = self.fleet_queries(window, namespace, rules, recorded)
        if recorded:
            queries.update(entity_queries(window, assumed, th))
        first_res = self._submit(queries, window)  # each read as it is needed
        if namespace is not None:
            # Who uses what, on the nodes where the namespace ran (a small answer, among the
            # first four in flight), while the store computes the rest of the round.
            more_first = self.members_queries(
                window, namespace, {lab.get("node", "") for lab, _ in first_res["ns_nodes"]})
            queries.update(more_first)
            first_res.add(self._submit(more_first, window))

        nodes = node_infos(first_res["nodes"])
        first, checked = self._data_begins(window, first_res)
        checks += checked
        now = Now.parse(first_res["now"])
        hs = self._history_start(window, first)
        entity_rows: list[tuple[dict[str, str], float]] = []
        if recorded and hs != assumed:
            # Data began within the window: the numbers over its own history, where the
            # records give them.
            if not bounded(window, hs, th):
                return self._fleet(window, namespace, records=False)
            # (Role ``again entities``: a part's name is its role up to any "#".)
            own = {f"again {k}": q for k, q in entity_queries(window, hs, th).items()}
            queries.update(own)
            entity_rows = self._submit(own, window)["again entities"]
        elif recorded:
            entity_rows = first_res["entities"]
        steps = round((window.end - hs) / window.step)
        # With the rules, each finding whose condition held at every recorded minute of the
        # history comes back as one summary (:meth:`run_queries`) instead of its steps (a
        # step of several minutes meets a rule where every minute in it does); the others'
        # steps are asked for afterwards (a third round, usually empty).
        summarize = rules and self.summaries and steps >= 1
        # With the rules: each node's numbers, and the devices of the nodes that need them
        # (read before the second round's groups need the models).
        summaries: dict[str, NodeSummary] = {}
        lean = self.lean(window, namespace, rules)
        if rules:
            # The nodes' numbers, and who uses what from the rules, to say which nodes'
            # devices and containers to read.
            numbers = self.summary_queries(window, namespace)
            queries.update(numbers)
            first_res.add(self._submit(numbers, window))
        # The summaries need only what holds at the end and when data begins: sent now,
        # while the store still computes who is where (the heaviest answers of the round).
        # The idle devices' whole runs came in ``now`` where the history is the one it
        # assumed (the store older than the window).
        idle_in_now = hs == assumed
        run_q = self.run_queries(
            window, hs, devices=() if recorded else {g.node for g in now.idle | now.spin},
            held=bool(now.held), stragglers=bool(now.flagged), namespace=namespace,
            idle_runs=not (idle_in_now or recorded)) if summarize else {}
        answers = self._submit(run_q, window)  # the second round joins these

        pods = pod_infos(first_res["pods"])
        groups_checked: int | None = None
        if rules:
            summaries = _summaries(first_res["node_summary"])
            if lean:
                groups_checked = int(next((v for _, v in first_res["groups"]), 0))
        # With the run records: the numbers per entity, the nodes they leave open (their
        # devices' runs read meanwhile) and every allocated-idle container's run.
        entities = entities_of(entity_rows) if recorded else None
        run_nodes: set[str] = set()  # (the nodes whose devices' runs are read)
        opened: set[str] = set()  # (and whose devices are, with the records)
        pending: _Pending | None = None
        if entities is not None:
            run_nodes, opened, pending = self._read_records(window, hs, entities, nodes,
                                                            summaries)
        inventory, light, users, ask = self._who_uses_what(
            window, namespace, now, first_res, pods, summaries, opened, queries,
            rules=rules, lean=lean, summarize=summarize)
        trail: _Trail | None = None
        more: dict[str, str] = {}
        if summarize:
            more, trail = self._summary_round(window, hs, ask, now, namespace, answers,
                                              first_res if idle_in_now else None, steps)
        # The inventory (sent after who uses what): with the summaries, read while the
        # store computes the second round.
        gpus = {**gpu_infos(inventory["gpus"]), **light}
        found: Found | None = None
        silent = now.silent
        if entities is not None and pending is not None:
            found = self._found(window, hs, entities, pending,
                                {r: i for r, i in gpus.items() if r.node in run_nodes}, nodes,
                                summaries)
            silent = set(found.devices.silent)
        if not summarize:
            # The waste split (idle nodes) and an idle MIG slice's "allocated" (busy nodes)
            # need when each idle device was held: every node with an idle or spinning one.
            more = self.second_round(window, replace(
                ask, idle_nodes=_idle_nodes_now(gpus, now) | {g.node for g in now.idle}
                | {g.node for g in now.spin}), namespace, rules)
            answers.add(self._submit(more, window))
        more.update(run_q)
        # What needs no answer of this round, while the store computes them.
        node_models = {n: s.model for n, s in summaries.items()}
        groups = _groups(users.members, pods, gpus, node_models) if summarize else {}
        whole: _Whole | None = None
        if trail is not None:
            # The summaries, sent first, are in before the rest of the round: read and
            # expanded (and the third round sent) while the store computes the rest.
            whole = self._whole_round(window, trail, now, users, groups, namespace)
            more.update(whole.extra)
        # Each device's window mean (sent last in the first round), while the rest runs.
        gpu_mean = {_gref(lab): v for lab, v in inventory["gpu_stats"]}
        later = answers.all()
        later.pop("runs", None)
        if whole is not None and whole.answers is not None:
            for role, rows in whole.answers.all().items():
                later.setdefault(role, []).extend(rows)
        return self._assembled(
            window, hs, later, users, pods, gpus, nodes, summaries, now, light,
            gpu_mean=gpu_mean, rules=rules, summarize=summarize, whole=whole,
            queries=len(queries) + len(more) + checks, silent=silent,
            groups_checked=groups_checked, holdings=first_res["holdings"], found=found,
            present_rows=first_res["nodes"])

    def _records_cover(self, window: Window, namespace: str | None, rules: bool,
                       assumed: float, records: bool) -> tuple[bool, int]:
        """Whether the verdicts' run records cover the page's history (the usual one, the
        store older than the window), so that the idle devices, nodes and slices and the
        allocated-idle containers come from them (``dashboard/plan/entities.py``: one query
        per table, whatever the fleet's state, and the findings of the nodes the page
        shows); and the checks that took. Over the rules' own window (the default hour: the
        price shares' records are over it) and the whole fleet, where :attr:`read_records`."""
        if not (records and self.read_records and self.prices is not None
                and self.lean(window, namespace, rules)):
            return False, 0
        since = self.runs_recorded_since(window)
        return (since is not None and since <= assumed
                and bounded(window, assumed, self.thresholds)), 1

    def _data_begins(self, window: Window, first: _Answers) -> tuple[float | None, int]:
        """When the window's data begins (:meth:`_history_start`'s ``first``): the full
        history where a device reported at the window's first step (the first round's
        ``nodes`` say), else the first step any did (None: none), and the queries that
        took."""
        if any(lab.get("stat") == "at_start" and v > 0 for lab, v in first["nodes"]):
            return self._full_history_at(window), 0
        return next((v for _, v in self.instant(self.first_query(window), window.end)
                     if math.isfinite(v)), None), 1

    def _read_records(self, window: Window, history_start: float, entities: Entities,
                      nodes: Mapping[str, NodeInfo], summaries: Mapping[str, NodeSummary],
                      ) -> tuple[set[str], set[str], _Pending]:
        """With the run records: the nodes whose devices' runs are read (the open and MIG
        nodes, the first idle rows' and the heatmap's: :func:`shown_nodes`), those whose
        devices are read (and the first allocated-idle rows' nodes, for their GPUs'
        index), and those runs and every allocated-idle container's, sent in the
        background beside the detail round."""
        th = self.thresholds
        node_price, gpus_on = self._priced(nodes, summaries)
        run_nodes = shown_nodes(entities, window, history_start, node_price, gpus_on,
                                summaries, self.first_rows, th.idle_duration)
        pending = (self._page_pool.submit(devices_of, self.instant, window, history_start,
                                          run_nodes, {}, th, self.cluster_label),
                   self._page_pool.submit(allocated_of, self.instant, window, history_start,
                                          th))
        opened = run_nodes | allocated_nodes(entities, node_price, gpus_on, self.first_rows)
        return run_nodes, opened, pending

    def _who_uses_what(self, window: Window, namespace: str | None, now: Now,
                       first_res: _Answers, pods: Mapping[PodKey, PodInfo],
                       summaries: Mapping[str, NodeSummary], opened: Collection[str],
                       queries: dict[str, str], *, rules: bool, lean: bool, summarize: bool,
                       ) -> tuple[_Answers, dict[GpuRef, GpuInfo], _Users, FollowUp]:
        """Who used what over the window (:class:`_Users`), what the second round asks of
        it, and where the devices come from: without the rules the first round (the whole
        fleet's); with them the devices of the nodes that need them (:func:`detail_nodes`:
        those a finding at the end names and those where who uses what matters), sent (and
        counted in ``queries``) as soon as those are known, and the devices
        :func:`partial_nodes` leaves aside (of the nodes only idle or silent devices name:
        as ``now`` says them, neither their inventory nor who uses what read)."""
        named = now.named()

        def read(need: set[str], members: bool) -> tuple[_Answers, dict[GpuRef, GpuInfo]]:
            aside = partial_nodes(now, need, summaries) if summarize else {}
            on = detail_nodes((named | need) - {g.node for g in aside}, summaries)
            # (and the means of those of its nodes the rules have no numbers for)
            detail = {**self.detail_queries(window, on, members),
                      **self.means_queries(window, [n for n in on if n not in summaries])}
            queries.update(detail)
            return (self._submit(detail, window),
                    {ref: info for ref, info in aside.items() if ref.node not in on})

        inventory: _Answers = first_res
        light: dict[GpuRef, GpuInfo] = {}
        if lean:
            # Who uses what is read on the nodes that need it, known before it is: where the
            # rules saw a device shared or a container near the input-starved range, and
            # where the straggler candidates' workloads have pods.
            need = {lab.get("node", "") for lab, _ in first_res["sharers"]}
            need |= {lab.get("node", "") for lab, _ in first_res["input_range"]}
            workloads = now.judged | {key[:3] for key in now.flagged}
            need |= {p.node for p in pods.values()
                     if (node_parts(p.node)[0], p.namespace, p.workload) in workloads}
            inventory, light = read(need | set(opened), True)
        users = _Users.of(inventory["members"], pods, namespace, self.thresholds)
        ask = users.follow_up(now)
        # The stragglers' evidence is read when their rows are shown (``read_evidence``),
        # of the rows shown alone, not here of every workload that may hold one.
        if rules and not lean:
            # Who uses what came first: the devices of the nodes that need them, asked now.
            need = set(ask.shared) | set(ask.candidates)
            need |= set(ask.slow) | {c.node for c in users.mean if c.pod in users.input_pods}
            need |= {n for key in now.flagged for n in users.workload_nodes.get(key[:3], ())}
            inventory, light = read(need, False)
        return inventory, light, users, ask

    def _summary_round(self, window: Window, history_start: float, ask: FollowUp, now: Now,
                       namespace: str | None, answers: _Answers, idle_rows: _Answers | None,
                       steps: int) -> tuple[dict[str, str], _Trail]:
        """With the run summaries: the second round (what the summaries leave to steps),
        sent and joined to ``answers``; the summaries read (with the idle devices' whole
        runs of ``idle_rows``' ``now`` where it counted them); and the findings at the end
        they leave out, on one-minute steps (those whose runs began within the history),
        asked now (one more query, only then) while the store computes the rest. The
        queries sent, and what :meth:`_whole_round` reads on."""
        # The stragglers' rules at the end say which workloads can hold one: their steps
        # only where the summaries do not describe them.
        strag_ask: dict[str, Any] = {} if not now.straggler_rules else {
            "candidates": (), "slow": ()}
        more = self.second_round(window, replace(ask, idle=(), spinning=(), held=(),
                                                 **strag_ask), namespace, True)
        answers.add(self._submit(more, window))
        # The summaries over the whole history (sent first in the round: in before the
        # inventory).
        rows = answers["runs"]
        minutes = round((window.end - history_start) / RULE_INTERVAL)
        if idle_rows is not None:
            rows = [*rows, *((lab, v) for lab, v in idle_rows["now"]
                             if lab.get("stat") == "idle" and round(v) == minutes)]
        runs = _FullRuns.parse(rows, window, steps, minutes)
        left = runs.fallback(now.idle, now.spin, now.held)
        trailing: _Answers | None = None
        if left.idle or left.held or (left.spinning and steps == minutes):
            trail = self.run_queries(window, history_start, held=bool(left.held),
                                     trailing=True)
            more.update({f"trailing {k}": q for k, q in trail.items()})
            trailing = self._submit(trail, window)
        return more, _Trail(rows, runs, trailing, steps, minutes)

    def _whole_round(self, window: Window, trail: _Trail, now: Now, users: _Users,
                     groups: Mapping[GroupKey, Mapping[GpuRef, Sequence[ContainerRef]]],
                     namespace: str | None) -> _Whole:
        """The findings the summaries hold whole (the trailing ones merged in), for the
        verdicts: the stragglers' groups they describe whole (their containers with no
        steps, their devices with no work signals: the store's findings are theirs), and
        the steps of the rest asked by node (a third round, usually empty)."""
        runs = trail.runs
        if trail.answers is not None:
            runs = runs.merged(_FullRuns.parse(trail.answers["runs"], window, trail.steps,
                                               trail.minutes, trailing=True))
        again = runs.fallback(now.idle, now.spin, now.held)
        strag = _StragglerRuns.parse(trail.rows, runs.grid)
        whole, rest = strag.split(now.flagged, groups, now.spin | users.shared)
        rest_workloads = {key[:3] for key in rest}
        nodes_of = users.workload_nodes
        again = replace(
            again,
            candidates={n for k in rest_workloads for n in nodes_of.get(k, ())},
            slow={n for key in rest if "slow" in now.flagged[key].values()
                  for n in nodes_of.get(key[:3], ())})
        extra = self.second_round(window, again, namespace, True, by_node=True)
        return _Whole(
            containers={c: _NO_POINTS for key in whole for cs in groups[key].values()
                        for c in cs},
            devices={g for key in whole for g in groups[key]},
            extra=extra,
            answers=self._submit(extra, window) if extra else None,
            # The findings held whole, for the verdicts (a step history asked again is
            # judged instead).
            summary=runs.summary(strag.whole(whole)))

    def _assembled(self, window: Window, history_start: float,
                   later: Mapping[str, list[Any]], users: _Users,
                   pods: dict[PodKey, PodInfo], gpus: dict[GpuRef, GpuInfo],
                   nodes: dict[str, NodeInfo], summaries: dict[str, NodeSummary], now: Now,
                   light: Mapping[GpuRef, GpuInfo], *, gpu_mean: dict[GpuRef, float],
                   rules: bool, summarize: bool, whole: _Whole | None, queries: int,
                   silent: Collection[GpuRef], groups_checked: int | None,
                   holdings: list[tuple[dict[str, str], float]], found: Found | None,
                   present_rows: list[tuple[dict[str, str], float]],
                   ) -> FleetData:
        """The page's :class:`FleetData` from the rounds' answers (``later``, by role)."""
        th = self.thresholds
        # Every container in the window (with the rules over their window: on the nodes
        # that need it); a history only where a verdict can use one.
        containers: dict[ContainerRef, Series] = dict.fromkeys(users.mean, _NO_POINTS)
        containers.update({_cref(lab): s for lab, s in later.get("containers", [])
                           if lab.get("namespace")})
        # (Asked by uuid: a device of that uuid on another node is not this one.)
        containers.update({ref: s for lab, s in later.get("shared_containers", [])
                           if lab.get("namespace") and (ref := _cref(lab)).gpu in users.shared})
        if whole is not None:
            containers.update(whole.containers)
        busy_max, idle_signal = idle_steps(later.get("idle_steps", []))
        usage, usage_signal = _merge_signals(
            (_cref(lab), lab.get("signal", "utilization"), s)
            for lab, s in later.get("held_idle", []) if lab.get("namespace"))
        signals = work_signals_of(
            [*later.get("spinning", []), *later.get("workload_signals", [])],
            whole.devices if whole is not None else set())
        device_nodes = {g.node for g in gpus} | set(summaries)
        bare_nodes(nodes, device_nodes)
        history = window.end - history_start
        counts = node_presence(present_rows, device_nodes)
        return FleetData(
            window=window,
            history_start=history_start,
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max=busy_max,
            gpu_mean=gpu_mean,
            gpu_step_mean={_gref(lab): s for lab, s in later.get("shared", [])
                           if _gref(lab) in users.shared},
            allocated={_gref(lab): s for lab, s in later.get("allocated", [])},
            containers=containers,
            container_stats=util_stats(later.get("stats", []), users.mean),
            pods=pods,
            idle_signal=idle_signal,
            signals=signals,
            read_spinning=partial(self.read_spinning, window, history_start)
            if summarize else None,
            read_evidence=partial(self.read_evidence, window,
                                  min(th.straggler_duration, window.seconds, max(history, 0.0)),
                                  rules),
            held_usage=usage,
            held_signal=usage_signal,
            queries=queries,
            silent=frozenset(silent),
            notes=(("Read from the gpuscope-dashboard recording rules.",) if rules else
                   (raw_note(len(nodes), RAW_NODES, self.thresholds, self.cluster_label),)
                   if len(nodes) > RAW_NODES else ()) + unlabelled_note(present_rows)
            + lag_note(present_rows, window, max(window.step, self.lookback), self._clock(),
                       self.served_newest(window)),
            node_summaries=summaries,
            workloads_checked=groups_checked,
            holdings=_holdings(holdings),
            holdings_step=RULE_INTERVAL if rules else window.step,
            present=presence(counts, RULE_INTERVAL if rules else window.step,
                             max(0.0, history)),
            runs=whole.summary if whole is not None else None,
            # With the rules, the devices the heatmap draws are read then.
            partial_nodes={n: summaries[n].gpus for n in {g.node for g in light}},
            read_devices=partial(self.read_devices, window) if rules else None,
            found=found,
        )

    def _priced(self, nodes: Mapping[str, NodeInfo], summaries: Mapping[str, NodeSummary],
                ) -> tuple[dict[str, float | None], dict[str, int]]:
        """Each node's $/hour as :attr:`prices` gives it (None: unknown), and its whole
        GPUs (the rules' numbers)."""
        assert self.prices is not None
        price = self.prices.node_price
        return ({n: price(i.instance_type, i.capacity_type).per_hour for n, i in nodes.items()},
                {n: s.gpus for n, s in summaries.items()})

    def _found(self, window: Window, history_start: float, entities: Entities,
               pending: tuple[Future[Devices], Future[tuple[AllocatedIdle, ...]]],
               gpus: Mapping[GpuRef, GpuInfo], nodes: Mapping[str, NodeInfo],
               summaries: Mapping[str, NodeSummary]) -> Found:
        """The page's findings from the run records (:class:`Found`): the fleet's totals
        from ``entities`` and the devices ``pending`` read (their inventory in ``gpus``),
        priced by :attr:`prices`, with every allocated-idle container's finding."""
        node_price, gpus_on = self._priced(nodes, summaries)
        devices = pending[0].result()
        devices = with_gpus(devices, {ref.node for ref in gpus}, gpus)
        totals = fleet_totals(entities, devices, window, history_start, node_price, gpus_on,
                              self.thresholds.idle_duration)
        return Found(totals, devices, pending[1].result(), entities.allocated,
                     partial(self.read_idle_nodes, window, history_start))

    def read_idle_nodes(self, window: Window, history_start: float, nodes: Collection[str]
                        ) -> dict[str, NodeIdle]:
        """The idle verdicts of ``nodes`` from their devices' runs and inventory (one round
        for the inventory, then the runs): what the idle table's rows from a node's
        numbers show when they are (``Found.read_nodes``). Raises
        :class:`~gpuscope.dashboard.data.source.DataError` where the store fails."""
        inventory = self._submit(self.detail_queries(window, nodes, False), window)
        devices = devices_of(self.instant, window, history_start, nodes,
                             gpu_infos(inventory["gpus"]), self.thresholds, self.cluster_label)
        return idle_nodes(devices.gpus, devices.idle)

    def read_spinning(self, window: Window, history_start: float, whole: Collection[str],
                      trailing: Collection[str]) -> dict[GpuRef, dict[str, float]]:
        """The means of the summarised spinning devices' other signals on the nodes given
        (:meth:`spinning_means_queries`: ``whole``, of the devices spinning over the whole
        history; ``trailing``, of those whose run began within it), by signal: what the
        spinning rows the page shows display (``FleetData.read_spinning``). Raises
        :class:`~gpuscope.dashboard.data.source.DataError` where the store fails."""
        queries = {**self.spinning_means_queries(window, history_start, whole),
                   **{f"trailing {k}": q for k, q in self.spinning_means_queries(
                       window, history_start, trailing, trailing=True).items()}}
        if not queries:
            return {}
        answers = self._submit(queries, window)
        means: dict[GpuRef, dict[str, float]] = {}
        for role in ("runs", "trailing runs"):
            for lab, v in answers[role]:
                if lab.get("stat") == "spin":
                    means.setdefault(_gref(lab), {})[lab.get("signal", "")] = v
        return means

    def read_evidence(self, window: Window, seconds: float, rules: bool,
                      nodes: Collection[str]) -> dict[GpuRef, Evidence]:
        """The stragglers' evidence on ``nodes``' devices over the last ``seconds`` of
        ``window`` (:meth:`second_round`'s ``evidence``; from the recorded throttling with
        ``rules``): what the stragglers' rows the page shows read
        (``FleetData.read_evidence``). Raises
        :class:`~gpuscope.dashboard.data.source.DataError` where the store fails."""
        if not nodes or seconds <= 0:
            return {}
        queries = self.second_round(window, FollowUp(evidence=nodes, evidence_seconds=seconds),
                                    rules=rules)
        return _evidence(self._submit(queries, window)["evidence"])

    def read_devices(self, window: Window, means_of: Collection[str],
                     inventory_of: Collection[str] = (),
                     ) -> tuple[dict[GpuRef, float], dict[GpuRef, GpuInfo]]:
        """The window means of ``means_of``' devices (:meth:`means_queries`) and the
        ``gpu_info`` of ``inventory_of``' (:meth:`detail_queries`), in one round: what the
        heatmap draws of the nodes the page lacks them of (``FleetData.read_devices``).
        Raises :class:`~gpuscope.dashboard.data.source.DataError` where the store fails."""
        queries = {**(self.means_queries(window, means_of) if means_of else {}),
                   **(self.detail_queries(window, inventory_of, False) if inventory_of
                      else {})}
        if not queries:
            return {}, {}
        answers = self._submit(queries, window)
        means = {_gref(lab): v for lab, v in answers["gpu_stats"]}
        return means, gpu_infos(answers["gpus"]) if inventory_of else {}
