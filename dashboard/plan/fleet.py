"""The fleet page's data from a Prometheus-compatible store: :class:`PrometheusData` runs
the plan's rounds of queries (:mod:`.queries`) and reads their answers into
:class:`~gpuscope.dashboard.series.FleetData` for the verdicts judged in the views (idle
GPUs, nodes and slices, spinning, allocated-idle, starvation, stragglers); the registry's
own verdicts are asked beside it, as step queries."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import replace
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
    bare_nodes,
    gpu_infos,
    idle_steps,
    node_infos,
    partial_nodes,
    pod_infos,
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
from gpuscope.dashboard.plan.rules import RAW_NODES, RAW_NOTE
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
    Holding,
    HoldingKey,
    NodeInfo,
    NodeSummary,
    Runs,
    Series,
    Window,
    gc_paused,
)
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
        of the nodes that need them, :func:`detail_nodes`)."""
        with gc_paused():
            return self._fleet(window or self.window(window_seconds), namespace)

    def _fleet(self, window: Window, namespace: str | None, records: bool = True
               ) -> FleetData:
        if namespace is not None:
            namespace = validate_namespace(namespace)
        rules, checks = self._check_rules(window)
        th = self.thresholds
        # Where the verdicts' run records cover the page's history (the usual one, the
        # store older than the window), the idle devices, nodes and slices and the
        # allocated-idle containers come from them (``dashboard/plan/entities.py``): one
        # query per table, whatever the fleet's state, and the findings of the nodes the
        # page shows. Over the rules' own window (the default hour: the price shares'
        # records are over it) and the whole fleet.
        assumed = self.assumed_start(window)
        recorded = False
        if (records and self.read_records and self.prices is not None
                and self.lean(window, namespace, rules)):
            checks += 1
            since = self.runs_recorded_since(window)
            recorded = since is not None and since <= assumed and bounded(window, assumed, th)
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
        first: float | None = None
        if any(lab.get("stat") == "at_start" and v > 0 for lab, v in first_res["nodes"]):
            first = self._full_history_at(window)
        if first is None:  # no device reported at the window's first step
            checks += 1
            first = next((v for _, v in self.instant(self.first_query(window), window.end)
                          if math.isfinite(v)), None)
        now = Now.parse(first_res["now"])
        idle_now, spin_now, silent = now.idle, now.spin, now.silent
        held_nodes, held_refs, flagged = now.held_nodes, now.held, now.flagged
        judged, slow = now.judged, now.slow

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
        inventory = first_res
        # The nodes a finding at the end names (their devices are read with the rules).
        named = now.named()
        lean = self.lean(window, namespace, rules)

        def read_devices(on: Collection[str], members: bool) -> _Answers:
            """:meth:`detail_queries` of ``on``, and the means of those of its nodes the
            rules have no numbers for (:meth:`means_queries`), sent (and counted)."""
            detail = {**self.detail_queries(window, on, members),
                      **self.means_queries(window, [n for n in on if n not in summaries])}
            queries.update(detail)
            return self._submit(detail, window)

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
        idle_in_now = hs == self.assumed_start(window)
        run_q = self.run_queries(
            window, hs, devices=() if recorded else {g.node for g in idle_now | spin_now},
            held=bool(held_refs), stragglers=bool(flagged), namespace=namespace,
            idle_runs=not (idle_in_now or recorded)) if summarize else {}
        answers = self._submit(run_q, window)  # the second round joins these

        pods = pod_infos(first_res["pods"])
        groups_checked: int | None = None
        if rules:
            summaries = _summaries(first_res["node_summary"])
            if lean:
                groups_checked = int(next((v for _, v in first_res["groups"]), 0))
        # The nodes only idle or silent devices name: their devices as ``now`` says them
        # (the rest are busy), neither their inventory nor who uses what read.
        light: dict[GpuRef, GpuInfo] = {}
        # With the run records: the numbers per entity, the nodes they leave open (their
        # devices' runs read meanwhile) and every allocated-idle container's run.
        entities = entities_of(entity_rows) if recorded else None
        opened: set[str] = set()  # (the nodes whose devices are read with the records)
        run_nodes: set[str] = set()  # (and whose devices' runs)
        pending: tuple[Future[Devices], Future[tuple[AllocatedIdle, ...]]] | None = None
        if entities is not None:
            node_price, gpus_on = self._priced(nodes, summaries)
            # The open and MIG nodes, the first idle rows' and the heatmap's, and the first
            # allocated-idle rows' nodes (their GPUs' index): read with the others.
            run_nodes = shown_nodes(entities, window, hs, node_price, gpus_on, summaries,
                                    self.first_rows, th.idle_duration)
            pending = (self._page_pool.submit(devices_of, self.instant, window, hs, run_nodes,
                                              {}, th, self.cluster_label),
                       self._page_pool.submit(allocated_of, self.instant, window, hs, th))
            opened = run_nodes | allocated_nodes(entities, node_price, gpus_on,
                                                 self.first_rows)

        def detail(need: set[str]) -> tuple[set[str], dict[GpuRef, GpuInfo]]:
            """The nodes whose devices are read (:func:`detail_nodes`), of those named and
            ``need`` (who uses what there matters), and the devices of those
            :func:`partial_nodes` leaves aside (none of them read)."""
            aside = partial_nodes(now, need, summaries) if summarize else {}
            on = detail_nodes((named | need) - {g.node for g in aside}, summaries)
            return on, {ref: info for ref, info in aside.items() if ref.node not in on}

        if lean:
            # Who uses what is read on the nodes that need it, known before it is: where the
            # rules saw a device shared or a container near the input-starved range, and
            # where the straggler candidates' workloads have pods.
            need = {lab.get("node", "") for lab, _ in first_res["sharers"]}
            need |= {lab.get("node", "") for lab, _ in first_res["input_range"]}
            workloads = judged | {key[:3] for key in flagged}
            need |= {p.node for p in pods.values()
                     if (node_parts(p.node)[0], p.namespace, p.workload) in workloads}
            on, light = detail(need | opened)
            inventory = read_devices(on, True)
        member_rows = (inventory if lean else first_res)["members"]

        # Every container in the window (with the rules over their window: on the nodes
        # that need it); a history only where a verdict can use one.
        # Each container's raw mean over the window (the input statistics' mean).
        member_mean = {_cref(lab): v for lab, v in member_rows if lab.get("namespace")}
        members = list(member_mean)
        # Input starvation's candidates: the raw mean in the rule's range (of the namespace
        # filtered to: the other containers on its devices are there for time-slicing).
        input_pods = {
            lab.get("pod", "") for lab, mean in member_rows
            if lab.get("namespace") and th.input_low <= mean <= th.input_high
            and (namespace is None or lab.get("namespace") == namespace)}

        sharers: dict[GpuRef, int] = {}
        for c in members:
            gpu = c.gpu
            sharers[gpu] = sharers.get(gpu, 0) + 1
        shared = {g for g, n in sharers.items() if n >= 2}
        workload_nodes: dict[tuple[str, str, str], set[str]] = {}
        for c in members:
            pod = pods.get(c.pod_key)
            if pod is not None and pod.workload:
                workload_nodes.setdefault((node_parts(c.node)[0], c.namespace, pod.workload),
                                          set()).add(c.node)
        history = window.end - hs
        ask = FollowUp(
            idle={g.node for g in idle_now},
            # (``idle_nodes``: below, from the inventory, where the summaries are not used.)
            shared={g.node for g in shared},
            shared_devices={g.uuid for g in shared},
            spinning={g.node for g in spin_now},
            held=held_nodes,
            candidates={n for k in judged for n in workload_nodes.get(k, ())},
            slow={n for k in slow for n in workload_nodes.get(k, ())},
            input=input_pods,
        )
        # The stragglers' evidence is read when their rows are shown (``read_evidence``),
        # of the rows shown alone, not here of every workload that may hold one.
        if rules and not lean:
            # Who uses what came first: the devices of the nodes that need them, asked now.
            need = set(ask.shared) | set(ask.candidates)
            need |= set(ask.slow) | {c.node for c in member_mean if c.pod in input_pods}
            need |= {n for key in flagged for n in workload_nodes.get(key[:3], ())}
            on, light = detail(need)
            inventory = read_devices(on, False)
        node_models = {n: s.model for n, s in summaries.items()}
        # The stragglers summarised whole: their groups' containers come with no steps, and
        # their devices with no work signals, whatever else was asked about them (a node's
        # every device comes back): the store's findings are theirs.
        strag_containers: dict[ContainerRef, Series] = {}
        strag_devices: set[GpuRef] = set()
        trail_res: _Answers | None = None
        if summarize:
            # The stragglers' rules at the end say which workloads can hold one: their
            # steps only where the summaries do not describe them.
            strag_ask: dict[str, Any] = {} if not now.straggler_rules else {
                "candidates": (), "slow": ()}
            more = self.second_round(window, replace(
                ask, idle=(), spinning=(), held=(), **strag_ask),
                namespace, rules)
            answers.add(self._submit(more, window))
            # The summaries over the whole history (sent first in the round: in before the
            # inventory); findings at the end they leave out, on one-minute steps: those
            # whose runs began within the history, asked now (one more query, only then),
            # while the store computes the rest.
            rows = answers["runs"]
            minutes = round((window.end - hs) / RULE_INTERVAL)
            if idle_in_now:
                rows = [*rows, *((lab, v) for lab, v in first_res["now"]
                                 if lab.get("stat") == "idle" and round(v) == minutes)]
            runs = _FullRuns.parse(rows, window, steps, minutes)
            left = runs.fallback(idle_now, spin_now, held_refs)
            if left.idle or left.held or (left.spinning and steps == minutes):
                trail = self.run_queries(window, hs, held=bool(left.held), trailing=True)
                more.update({f"trailing {k}": q for k, q in trail.items()})
                trail_res = self._submit(trail, window)
        # The inventory (sent after who uses what): with the summaries, read while the
        # store computes the second round.
        gpus = {**gpu_infos(inventory["gpus"]), **light}
        found: Found | None = None
        if entities is not None and pending is not None:
            found = self._found(window, hs, entities, pending,
                                {r: i for r, i in gpus.items() if r.node in run_nodes}, nodes,
                                summaries)
            silent = set(found.devices.silent)
        if not summarize:
            # Nodes idle now (every whole GPU, or every slice of one in MIG mode, idle or
            # spinning): the waste split asks when their devices were held.
            slices_of: dict[GpuRef, list[GpuRef]] = {}
            for info in gpus.values():
                if not info.is_physical:
                    slices_of.setdefault(GpuRef(info.node, info.parent_uuid), []).append(
                        info.ref)
            node_idle: dict[str, bool] = {}
            for info in gpus.values():
                if info.is_physical:
                    parts = slices_of.get(info.ref) or [info.ref]
                    node_idle[info.node] = node_idle.get(info.node, True) and all(
                        p in idle_now or p in spin_now for p in parts)
            # The waste split (idle nodes) and an idle MIG slice's "allocated" (busy nodes)
            # need when each idle device was held: every node with an idle or spinning one.
            more = self.second_round(window, replace(
                ask, idle_nodes={n for n, idle in node_idle.items() if idle}
                | {g.node for g in idle_now} | {g.node for g in spin_now}),
                namespace, rules)
            answers.add(self._submit(more, window))
        more.update(run_q)
        # What needs no answer of this round, while the store computes them.
        containers: dict[ContainerRef, Series] = dict.fromkeys(members, _NO_POINTS)
        groups = _groups(members, pods, gpus, node_models) if summarize else {}
        summary: Runs | None = None
        extra: dict[str, str] = {}
        extra_res: _Answers | None = None
        if summarize:
            # The summaries, sent first, are in before the rest of the round: read and
            # expanded (and the third round sent) while the store computes the rest.
            if trail_res is not None:
                runs = runs.merged(_FullRuns.parse(trail_res["runs"], window, steps, minutes,
                                                   trailing=True))
            again = runs.fallback(idle_now, spin_now, held_refs)
            strag = _StragglerRuns.parse(rows, runs.grid)
            whole, rest = strag.split(flagged, groups, spin_now | {
                g for g, n in sharers.items() if n >= 2})
            rest_workloads = {key[:3] for key in rest}
            again = replace(
                again,
                candidates={n for k in rest_workloads for n in workload_nodes.get(k, ())},
                slow={n for key in rest if "slow" in flagged[key].values()
                      for n in workload_nodes.get(key[:3], ())})
            strag_containers = {c: _NO_POINTS for key in whole
                                for cs in groups[key].values() for c in cs}
            strag_devices = {g for key in whole for g in groups[key]}
            extra = self.second_round(window, again, namespace, rules, by_node=True)
            extra_res = self._submit(extra, window) if extra else None
            # The findings held whole, for the verdicts (a step history asked again is
            # judged instead).
            summary = runs.summary(strag.whole(whole))
        # Each device's window mean (sent last in the first round), while the rest runs.
        gpu_mean = {_gref(lab): v for lab, v in inventory["gpu_stats"]}
        later = answers.all()
        later.pop("runs", None)
        if extra_res is not None:
            for role, rows in extra_res.all().items():
                later.setdefault(role, []).extend(rows)
        more.update(extra)

        containers.update({_cref(lab): s for lab, s in later.get("containers", [])
                           if lab.get("namespace")})
        # (Asked by uuid: a device of that uuid on another node is not this one.)
        containers.update({ref: s for lab, s in later.get("shared_containers", [])
                           if lab.get("namespace") and (ref := _cref(lab)).gpu in shared})
        containers.update(strag_containers)
        stats = util_stats(later.get("stats", []), member_mean)
        busy_max, idle_signal = idle_steps(later.get("idle_steps", []))
        usage, usage_signal = _merge_signals(
            (_cref(lab), lab.get("signal", "utilization"), s)
            for lab, s in later.get("held_idle", []) if lab.get("namespace"))
        signals = work_signals_of(
            [*later.get("spinning", []), *later.get("workload_signals", [])], strag_devices)
        bare_nodes(nodes, {g.node for g in gpus} | set(summaries))
        return FleetData(
            window=window,
            history_start=hs,
            gpus=gpus,
            nodes=nodes,
            gpu_busy_max=busy_max,
            gpu_mean=gpu_mean,
            gpu_step_mean={_gref(lab): s for lab, s in later.get("shared", [])
                           if _gref(lab) in shared},
            allocated={_gref(lab): s for lab, s in later.get("allocated", [])},
            containers=containers,
            container_stats=stats,
            pods=pods,
            idle_signal=idle_signal,
            signals=signals,
            read_spinning=partial(self.read_spinning, window, hs) if summarize else None,
            read_evidence=partial(self.read_evidence, window,
                                  min(th.straggler_duration, window.seconds, max(history, 0.0)),
                                  rules),
            held_usage=usage,
            held_signal=usage_signal,
            queries=len(queries) + len(more) + checks,
            silent=frozenset(silent),
            notes=(("Read from the gpuscope-dashboard recording rules.",) if rules else
                   (RAW_NOTE.format(nodes=len(nodes), most=RAW_NODES),)
                   if len(nodes) > RAW_NODES else ()),
            node_summaries=summaries,
            workloads_checked=groups_checked,
            holdings=_holdings(first_res["holdings"]),
            runs=summary,
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
