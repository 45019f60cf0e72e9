"""The fleet page's plan of Prometheus queries, part three: each round's queries
(:meth:`PlanQueries.fleet_queries`, :meth:`~PlanQueries.second_round`,
:meth:`~PlanQueries.run_queries`, ...), over the window the store serves and with the
recording rules where they serve it (:mod:`.served`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from gpuscope.dashboard.data.http import PromApi
from gpuscope.dashboard.data.prometheus import (
    CLUSTER_LABEL,
    EDGE,
    _split,
    _util_step,
)
from gpuscope.dashboard.data.promql import (
    duration,
    escape_label_value,
    labelled,
    node_matchers,
    selector,
)
from gpuscope.dashboard.data.recorded import (
    CBY,
    GBY,
    GROUP,
    MEMBER,
    NOT_EMPTY,
    RULE_INTERVAL,
    RULE_R,
    RULES,
    History,
    Steps,
)
from gpuscope.dashboard.data.source import (
    DataError,
)
from gpuscope.dashboard.plan import second
from gpuscope.dashboard.plan.rules import LEAN_WINDOW, _stat
from gpuscope.dashboard.plan.runs import FollowUp, _Answers
from gpuscope.dashboard.plan.served import ServedStore, newest_sample
from gpuscope.dashboard.prices import PriceTable
from gpuscope.dashboard.series import (
    Window,
)
from gpuscope.dashboard.verdicts import Thresholds, allocated, idle, spinning, stragglers
from gpuscope.dashboard.verdicts.spinning import (
    spinning_means_promql,
    spinning_minutes_promql,
    spinning_runs_promql,
)
from gpuscope.dashboard.verdicts.stragglers import straggler_runs_promql


class PlanQueries(ServedStore):
    """The store, with the fleet page's thresholds (None: the defaults) and its queries."""

    def __init__(
        self,
        url: str,
        *,
        thresholds: Thresholds | None = None,
        timeout: float = 10.0,
        min_step: float = 15.0,
        max_points: int = 60,
        lookback: float = 60.0,
        clock: Callable[[], float] = time.time,
        workers: int = 8,
        client: PromApi | None = None,
        cluster_label: str = CLUSTER_LABEL,
        prices: PriceTable | None = None,
    ) -> None:
        super().__init__(url, thresholds=thresholds, timeout=timeout, min_step=min_step,
                         max_points=max_points, lookback=lookback, clock=clock,
                         workers=workers, client=client, cluster_label=cluster_label)
        #: How the page prices nodes: with it, the page reads the idle and allocated-idle
        #: findings from the verdicts' run records where they cover its history (its
        #: tables' first rows are the dearest); without, every finding.
        self.prices = prices

    def _steps(self, window: Window, rules: bool, match: Mapping[str, str] | None = None
               ) -> Steps:
        return Steps(*self._r(window), rules=rules, match=match)

    def fleet_queries(self, window: Window, namespace: str | None,
                      rules: bool = False, recorded_runs: bool = False) -> dict[str, str]:
        """The fleet page's first round of PromQL, by role: instant queries at the window's
        end. Every verdict needs its condition at the latest step (a trailing run), so the
        server applies each rule to that step over the whole fleet (one step) and sends back
        only what meets it (``now``: idle, spinning, throttled devices, allocated-idle
        containers, straggler candidates' workloads and, with the rules, the stragglers'
        devices (on a step of several minutes, those flagged at each of its minutes),
        devices with nothing to judge them by), beside who
        is where (devices, nodes, pods, containers in the window, each container with its
        raw mean: the input-starved candidates) and each device's window mean.
        :meth:`second_round` then asks the history of what was singled out, by node. No
        query here names a device or a node. With ``rules``, ``now`` reads what the
        ``gpuscope-dashboard`` recording rules recorded in the last step."""
        r, rr = self._r(window)
        w = duration(window.seconds)
        s = duration(window.step)
        # The window's steps, its start included, over a range half a step longer:
        # Prometheus 2 takes a subquery's or a range's start, VictoriaMetrics does not.
        whole = duration(window.seconds + window.step / 2)
        st = Steps(r, rr, rules)
        th = self.thresholds

        # Who uses what and which devices there are, of every node: the queries
        # :meth:`detail_queries` asks of some nodes with the rules.
        every = self.detail_queries(window, None, members=True)
        pods = "gpu_pod_info"
        members = every["members"]
        if namespace is not None:
            # Who uses what: the namespace's devices and every container on them (asked by
            # :meth:`members_queries` on the nodes this finds: not every container's series).
            mine = selector("container_gpu_utilization_ratio", namespace=namespace)
            members = f"count by (node) (last_over_time({mine}[{w}]))"
            pods = selector("gpu_pod_info", namespace=namespace)
        def recorded(key: str, by: str) -> str:
            return f"max by ({by}) (last_over_time({RULES[key]}[{r}]))"

        minutes = second.step_minutes(window)

        def at_end(key: str, by: str) -> str:
            """The sparse series ``key`` at the last step: at each of its minutes."""
            if minutes == 1:
                return recorded(key, by)
            return second.every_minute(RULES[key], by, "last_over_time", r, minutes)

        if rules:
            now = [
                # With how many minutes each was idle: the run summaries of those idle
                # at every one (where the history is the one assumed, as it usually is).
                _stat(idle.idle_now_promql(self._history(window, self.assumed_start(window))),
                      "idle"),
                _stat(recorded("spin", GBY), "spin"),
                _stat(recorded("held_idle", f"{CBY}, signal"), "held_idle"),
                # The stragglers' own rules at the end, beside the candidates: which groups
                # can hold one, and which of their devices (on a step of several minutes,
                # those flagged at each of its minutes: the stragglers are judged on the
                # recorded minutes, as the idle and allocated-idle devices are). Whether
                # those rules are loaded at all (a rule file older than the page's records
                # none; then the candidates' steps are asked for, as without the
                # summaries): the group medians, recorded wherever a workload has two
                # devices of a model.
                " or ".join([
                    _stat(recorded("candidates", "namespace, workload, kind"), "candidate"),
                    _stat(at_end("stalled", MEMBER), "stalled"),
                    _stat(at_end("slow", f"{MEMBER}, signal"), "slow"),
                    _stat(f"count(last_over_time({RULES['stalled_median']}[{r}]))",
                          "straggler_rules")]),
            ]
        else:
            now = [
                _stat(" or ".join(idle.idle_promql(st, th)), "idle"),
                _stat(spinning.spinning_promql(st, th), "spin"),
                " or ".join(_stat(p, "held_idle") for p in allocated.held_idle_promql(st, th)),
                *(_stat(p, "candidate") for p in stragglers.candidate_promql(st, th)),
            ]
        out = {
            "nodes": " or ".join([
                "max by (node, instance_type, zone, capacity_type) (gpu_node_info)",
                # When data begins: the first step at which any device reported. Where one
                # did a rate range before the window's first step (as it usually has: the
                # store is older than the window), the window's start, read at that time
                # alone (the rates of the window's first steps then cover their whole range);
                # else :meth:`first_query` (a query more, on a young store).
                # Asked of each node's GPU 0 only (a node's first device: a fifth to an
                # eighth of the series, 0.2 s of the store's time less at 5,000 nodes);
                # where none of them reported then, :meth:`first_query` asks of every device.
                _stat(f"count({selector('gpu_utilization_ratio', gpu='0')}"
                     f" @ {self._full_history_at(window):.3f})", "at_start"),
                # How many steps each node was there (its exporter's series): a node that
                # came up or went away within the window is charged for that time alone
                # (the holdings' steps; with the rules, its recorded minutes).
                _stat(self.presence_query(window, rules), "present"),
                # Devices whose series lack the ``node`` label (a scrape config of the
                # user's own without the relabeling): not on the page, so it says so.
                _stat(f"count(last_over_time("
                      f"{selector('gpu_info', node='', parent_uuid='')}[{w}]))", "unlabelled"),
                # The store's newest sample of an exporter, as of the dashboard's clock (the
                # page served earlier where the store is behind it, :meth:`served_window`,
                # says by how much): a verdict needs a point at the last step.
                # Per cluster: one cluster's data late (its remote write down, say) while
                # the others' is not leaves its nodes without a point at the last step; the
                # note names it.
                _stat(f"max by ({self.cluster_label}) "
                      f"(timestamp(gpu_node_info @ {self._clock():.3f}))", "newest"),
                # And each cluster's newest within the hour (a subquery at steps of at most
                # a minute, the lookback's where shorter), to name the clusters whose data
                # is later than the store's lookback: they have no ``newest`` row.
                _stat(newest_sample(self.NEWEST_SPAN_MIN, min(self.lookback, 60.0),
                                    self.cluster_label, self._clock()), "seen"),
            ]),
            # Who uses which device in the window (a history only where asked for later).
            # Each one's raw mean over the window: the input-starved candidates are those
            # in the suspicious range (the rule's own test of the same mean: nothing is
            # lost); one pass over the containers' samples for both.
            # (With a namespace, the nodes where it ran: ``ns_nodes``.)
            "members" if namespace is None else "ns_nodes": members,
            "pods": f"max by (node, namespace, pod, workload) (last_over_time({pods}[{w}]))",
            # Who held what over the window, every node's (the showback).
            # (Two queries, not an ``or`` of them: the store would match 14,000 series at
            # 5,000 nodes for nothing.)
            **dict(zip(("holdings", "holdings#1"), self.holdings_queries(window, rules),
                       strict=True)),
            # Which devices there are (after who uses what, which the second round needs:
            # with the summaries it is sent before this is read).
            "gpus": every["gpus"],
        }
        if self.lean(window, namespace, rules):
            del out["members"]  # (:meth:`summary_queries`, then :meth:`detail_queries`)
        if rules:
            del out["gpus"]
        now[2] = " or ".join([
            now[2],
            # The devices with nothing to judge them by (no utilization, no GPM): with the
            # rules, recorded (every device's raw series read each minute by the rule, not
            # by the page: 0.35 s of the store's time at 5,000 nodes).
            _stat(recorded("silent", GBY) if rules else idle.silent_promql(st), "silent"),
        ])
        if rules and recorded_runs:
            # The idle devices and nodes, the allocated-idle containers and the devices
            # with no data come from the verdicts' run records (``dashboard/plan/
            # entities.py``): ``now`` asks the spinning devices and the stragglers alone.
            now = [now[1], now[3]]
        # One query per rule (``now``, ``now#1``...): they run side by side, and none comes
        # near a store's limit on one query's time (VictoriaMetrics: 30 s by default).
        # What holds at the end first (small answers the run summaries wait for), then who
        # is where.
        out = {"nodes": out.pop("nodes"),
               **{"now" if i == 0 else f"now#{i}": q for i, q in enumerate(now)}, **out}
        # Each device's mean, labelled with node and uuid alone (33 k rows at 5,000 nodes:
        # with its index and a ``stat`` label, a fifth more to send and read). Sent last and
        # read last: only the heatmap and the KPIs need it, not the second round, which
        # starts while the store still computes it. (With the rules: the nodes' numbers
        # instead, and the devices' means of the nodes :meth:`detail_queries` names.)
        if not rules:
            # The window mean of each step's utilization (the busy counter's rate, else the
            # gauge's mean): steps before a device appeared, or at which its counter is
            # younger than the rate's range, do not count.
            out["gpu_stats"] = (f"max by (node, uuid) (avg_over_time(({_util_step(rr)})"
                                f"[{whole}:{s}]))")
        return out

    def presence_query(self, window: Window, rules: bool) -> str:
        """Per node, at how many steps its exporter's series were there in ``window``
        (over the holdings' span): with ``rules`` its recorded minutes of whole GPUs
        (``node:gpu_whole:count1m``, one a minute), else its ``gpu_node_info`` over each
        of the window's steps (a subquery of one series per node; over the step, at least
        the lookback, as the embedded store buckets a node's samples: one failed scrape's
        staleness marker at a step's instant does not cost the node that step; a node gone
        away counts up to the lookback after its last sample, as there). ``max``: HA replicas'
        copies count once."""
        span = duration(window.seconds - window.step / 2)
        if rules:
            return f"max by (node) (count_over_time({RULES['node_gpus']}[{span}]))"
        return (f"count_over_time((max by (node) (max_over_time(gpu_node_info"
                f"[{self._r(window)[0]}])))[{span}:{duration(window.step)}])")

    def holdings_queries(self, window: Window, rules: bool) -> list[str]:
        """Who held what over ``window`` (:meth:`Steps.holdings`), summed over its steps
        after its start (a range half a step short of the window: both stores then take the
        same steps) and in device-seconds, labelled ``stat="held"`` and ``stat="used"`` (one
        query each): from the recorded minutes with ``rules`` (each a minute), else a
        subquery over the raw series at the window's step (:meth:`Steps.holdings_over`).
        ``max``: HA replicas' copies of a recorded series count once."""
        span = duration(window.seconds - window.step / 2)
        by = "node, namespace, workload, uuid"
        if rules:
            def total(used: bool) -> str:
                name = RULES["used" if used else "held"]
                return (f"max by ({by}) (sum_over_time({name}[{span}]))"
                        f" * {RULE_INTERVAL!r}")
        else:
            st = self._steps(window, False)
            step, whole = duration(window.step), duration(window.seconds)

            def total(used: bool) -> str:
                return (f"max by ({by}) ({st.holdings_over(span, step, whole, used)})"
                        f" * {window.step!r}")
        return [_stat(total(False), "held"), _stat(total(True), "used")]

    def summary_queries(self, window: Window, namespace: str | None) -> dict[str, str]:
        """With the recording rules: each node's numbers (``node_summary``, the rows
        of :class:`NodeSummary`), and, over the default window (:meth:`lean`), who uses
        what: the devices two containers or more used, the containers near the
        input-starved range, and how many straggler groups there are (a group's median is
        recorded each minute it has two devices or more). :meth:`detail_queries` then
        asks the devices and containers of the nodes these name."""
        r, _ = self._r(window)
        w = duration(window.seconds)
        whole = duration(window.seconds + window.step / 2)

        # One query per stat (``node_summary``, ``node_summary#1``...), not one ``or`` of
        # them: the store matches an ``or``'s 21,000 series at 5,000 nodes for nothing (the
        # stats never overlap), a quarter of the query's cost.
        out = {f"node_summary#{i}" if i else "node_summary": q for i, q in enumerate([
            _stat(f"max by (node) (last_over_time({RULES['node_gpus']}[{r}]))", "gpus"),
            _stat(f"max by (node, model) (last_over_time({RULES['node_models']}[{r}]))",
                 "model"),
            # The mean over the window's GPU-minutes.
            _stat(f"sum by (node) (sum_over_time({RULES['node_util_sum']}[{whole}]))"
                 f" / sum by (node) (sum_over_time({RULES['node_util_count']}[{whole}]))",
                 "mean"),
            _stat(f"max by (node) (max_over_time({RULES['node_util_count']}[{whole}]))",
                 "known"),
        ])}
        if self.lean(window, namespace, True):
            out["sharers"] = f"max by (node, uuid) (last_over_time({RULES['sharers']}[{r}]))"
            out["input_range"] = (f"max by ({CBY}) (last_over_time({RULES['input_range']}"
                                  f"[{r}]))")
            out["groups"] = (f"count(count by ({GROUP}) (last_over_time("
                             f"{RULES['stalled_median']}[{w}])))")
        return out

    def lean(self, window: Window, namespace: str | None, rules: bool) -> bool:
        """Whether the fleet page reads who uses what from the rules (the whole fleet over
        :data:`LEAN_WINDOW`: the window the rules describe containers over): then it reads
        the containers' series of the nodes that need them only. A namespace's page reads
        the namespace's nodes' (:meth:`members_queries`)."""
        return rules and namespace is None and round(window.seconds) == round(LEAN_WINDOW)

    def detail_queries(self, window: Window, nodes: Collection[str] | None,
                       members: bool = False) -> dict[str, str]:
        """With the recording rules, the devices of ``nodes`` (every node where None):
        each one's index, model and parent (``gpus``), and (``members``) each container's
        raw mean on them (``members``, as :meth:`fleet_queries` asks it of the whole fleet),
        in ``node=~`` lists (split as :func:`_split` does: ``gpus#1``...). Their window
        means are :meth:`means_queries`', asked of the nodes the page draws."""
        w = duration(window.seconds)

        def build(names: Sequence[str] | None) -> dict[str, str]:
            on = {} if names is None else node_matchers(names, self.cluster_label)
            info = selector("gpu_info", on)
            cutil = selector("container_gpu_utilization_ratio", {**on, "namespace": NOT_EMPTY})
            return {"gpus": f"max by (node, gpu, uuid, model, parent_uuid, mig_profile) ({info})",
                    "members": f"avg by ({CBY}) (avg_over_time({cutil}[{w}]))"}

        return self._lists(nodes, build, ("members", "gpus") if members else ("gpus",))

    def means_queries(self, window: Window, nodes: Collection[str] | None) -> dict[str, str]:
        """With the recording rules, each device's window mean on ``nodes`` (every node
        where None), in ``node=~`` lists (``gpu_stats``, ``gpu_stats#1``...): the heatmap's
        cells, asked of the nodes it draws (:attr:`FleetData.read_devices`), and of a node
        the rules have no numbers for (its mean is its devices')."""
        whole = duration(window.seconds + window.step / 2)

        def build(names: Sequence[str] | None) -> dict[str, str]:
            on = {} if names is None else node_matchers(names, self.cluster_label)
            util = selector(RULES["util"], on)
            return {"gpu_stats": f"max by (node, uuid) (avg_over_time({util}[{whole}]))"}

        return self._lists(nodes, build, ("gpu_stats",))

    @staticmethod
    def _lists(nodes: Collection[str] | None,
               build: Callable[[Sequence[str] | None], dict[str, str]],
               roles: Sequence[str]) -> dict[str, str]:
        """``build``'s queries of ``roles`` over ``nodes`` (one of each over every node where
        None), each split under the query limit (``role#1``...)."""
        if nodes is None:
            every = build(None)
            return {role: every[role] for role in roles}
        names = sorted(set(nodes))
        out: dict[str, str] = {}
        for role in roles:
            def of(part: Sequence[str], role: str = role) -> str:
                return build(part)[role]

            for n, q in enumerate(_split(names, of)):
                out[role if n == 0 else f"{role}#{n}"] = q
        return out

    def members_queries(self, window: Window, namespace: str, nodes: Collection[str]
                        ) -> dict[str, str]:
        """Who uses what where the page is filtered to ``namespace``: each container's raw
        mean over the window (as ``members`` of :meth:`fleet_queries`) on the devices the
        namespace used, every container on them (time-slicing shares need the other
        sharers too), asked on ``nodes`` (where it ran: the first round's ``ns_nodes``) in
        ``node=~`` lists: the fleet's other 29,000 containers' series are not read (0.46 s
        of the store's time at 5,000 nodes)."""
        w = duration(window.seconds)

        def build(names: Sequence[str]) -> str:
            on = node_matchers(names, self.cluster_label)
            cutil = selector("container_gpu_utilization_ratio", {**on, "namespace": NOT_EMPTY})
            mine = selector("container_gpu_utilization_ratio", on, namespace=namespace)
            return (f"avg by ({CBY}) (avg_over_time({cutil}[{w}]))"
                    f" and on (node, uuid) max by (node, uuid) (last_over_time({mine}[{w}]))")

        return {"members" if i == 0 else f"members#{i}": q
                for i, q in enumerate(_split(sorted(set(nodes)), build))}

    @staticmethod
    def first_query(window: Window) -> str:
        """When data begins in ``window``: the first step at which any device reported."""
        whole = duration(window.seconds + window.step / 2)
        return (f"min_over_time(timestamp(count(gpu_utilization_ratio))"
                f"[{whole}:{duration(window.step)}])")

    RANGE_QUERIES = frozenset({"containers", "shared_containers", "idle_steps", "allocated",
                               "shared", "spinning", "held_idle", "workload_signals"})
    INSTANT_QUERIES = frozenset({"gpus", "nodes", "gpu_stats", "members", "ns_nodes", "pods",
                                 "now", "stats", "evidence", "runs", "node_summary",
                                 "sharers", "input_range", "groups"})

    def second_round(self, window: Window, ask: FollowUp, namespace: str | None = None,
                     rules: bool = False, by_node: bool = False) -> dict[str, str]:
        """The history of what the first round singled out, asked by node (``node=~``
        lists; a query is at most :data:`MAX_QUERY_BYTES`, a longer list is split over
        queries named ``role#1``, ``role#2``...): per step, the idle steps of the devices
        there, allocation on the nodes idle now (the waste split), utilization of the
        time-sliced devices and their containers and of every container of the straggler
        candidates' nodes,
        the work signals of spinning GPUs and of slow-rank candidates' workloads,
        throttling, the held devices' use; and, at the end, the input-starved candidates'
        raw-sample statistics (stddev, count, memory; the mean is the first round's; asked by
        pod, ``pod=~``, for the candidates alone) and the stragglers' evidence over
        ``ask.evidence_seconds``.
        With ``rules``, the idle and held-idle steps are the recorded sparse
        series themselves, asked without a list (they hold only what meets the rule), or
        (``by_node``: the few findings :meth:`run_queries` could not summarise) by node.
        Each part is a function of :mod:`.second`."""
        r, rr = self._r(window)
        return second.second_round(
            second.Round(window, r, rr, rules, self.cluster_label, self.thresholds, namespace),
            ask, by_node)

    def run_queries(self, window: Window, history_start: float,
                    devices: Collection[str] = (),
                    held: bool = True, stragglers: bool = False,
                    namespace: str | None = None, trailing: bool = False,
                    idle_runs: bool = True) -> dict[str, str]:
        """With the recording rules: each finding whose sparse series has a sample at every
        recorded minute of the history (``(history_start, end]``), summarised in one number,
        instead of its steps (a whole fleet's idle and spinning devices would be hundreds
        of thousands of points); with ``trailing`` (asked once the first form's answer
        names findings at the end it did not summarise), each idle device and
        allocated-idle container (and on one-minute steps each spinning device) whose run
        began within the history instead, with how many minutes it holds (the verdict
        modules' forms over :attr:`History.to_end`: a subquery over every such series,
        which the page sends only when there are some). On a step of several minutes such a
        finding met its rule at every step too (a step meets it where each of its minutes
        does, as :meth:`second_round` asks). The summaries: idle devices (their signal),
        spinning devices (their utilization's mean; their other signals' means are
        :meth:`spinning_means_queries`', asked for the rows shown), how many of those
        minutes a container held each idle or spinning device (where ``devices`` names a
        node with one; all of them, or the steps are asked for; counted on the recorded
        minutes of ``uuid:gpu_idle_held:count1m``, whatever the scrape interval),
        allocated-idle containers (their means), and (``stragglers``; of ``namespace``
        where given) the stalled and slow devices with their means, and their groups'
        medians' means over the same minutes. Each form is its verdict module's
        (``idle_runs_promql``, ``spinning_runs_promql``, ``held_idle_runs_promql``,
        ``straggler_runs_promql``, ``held_runs_promql``, over :class:`History`); here they
        are labelled by ``stat``, each one query over the whole fleet, however many nodes
        hold a finding. Raw range functions over the recorded series (no subquery)."""
        # On a step of several minutes a spinning run that began within the history may
        # begin a step earlier in the steps (a step spins by its signals' means, which its
        # minutes' flags do not say): those are asked on one-minute steps only.
        spins_too = not trailing or math.isclose(window.step, RULE_INTERVAL)
        out: dict[str, str] = {}

        def stat(expr: str, name: str, signal: str = "") -> str:
            if signal:  # a spinning run's mean, by signal
                expr = labelled(expr, "signal", signal)
            return labelled(expr, "stat", name)

        # The sparse series alone: cheap over the whole fleet.
        fleet = self._history(window, history_start, to_end=trailing)
        # (The idle devices' whole runs are the first round's ``now`` where its history was
        # this one: ``idle_runs`` False.)
        parts = {"idle": stat(idle.idle_runs_promql(fleet), "idle")} if idle_runs else {}
        if spins_too:
            parts["spin"] = stat(spinning_runs_promql(fleet), "spin", "utilization")
        if held:
            parts["held_idle"] = stat(allocated.held_idle_runs_promql(fleet), "held_idle")
        if trailing:  # how long each run at the end has held
            if spins_too:
                parts["spin_n"] = stat(spinning_minutes_promql(fleet), "spin_n")
            if held:
                parts["held_idle_n"] = stat(allocated.held_idle_minutes_promql(fleet),
                                            "held_idle_n")
        # One query per form (``runs``, ``runs#spin``...), not an ``or`` of them: the forms
        # never overlap (their ``stat`` differs), and the store would match their series
        # for nothing (a sixth of the query's cost at 5,000 nodes).
        out.update({"runs" if i == 0 else f"runs#{name}": q
                    for i, (name, q) in enumerate(parts.items())})
        if trailing:
            return out
        if stragglers:
            ns = ({} if namespace is None
                  else {"namespace": f'="{escape_label_value(namespace)}"'})
            out[f"runs#{len(out)}"] = " or ".join(
                stat(q, name) for name, q in
                straggler_runs_promql(self._history(window, history_start, ns)).items())
        if devices:
            # Of every idle or spinning device at once (a sparse series of those devices,
            # joined to them at the end), not in node lists: one query however many nodes
            # have one (VictoriaMetrics, 5,000 nodes: 0.12 s at 87 %, where 15 lists were
            # sent; 0.05 s at 15 %).
            out[f"runs#{len(out)}"] = stat(idle.held_runs_promql(fleet), "held")
        return out

    def _history(self, window: Window, history_start: float,
                 match: Mapping[str, str] | None = None, to_end: bool = False) -> History:
        """The recorded minutes of ``(history_start, window.end]`` the run summaries read
        (:class:`History`: the range less a millisecond, its minutes, the last step's
        range), of the nodes (or namespace) ``match`` names."""
        r, _ = self._r(window)
        return History(duration(window.end - history_start - EDGE),
                       round((window.end - history_start) / RULE_INTERVAL), r,
                       dict(match or {}), window.end, to_end)

    def spinning_means_queries(self, window: Window, history_start: float,
                               nodes: Collection[str], trailing: bool = False
                               ) -> dict[str, str]:
        """With the recording rules: the means of the spinning devices' other signals
        (``sm``, ``tensor``, ``dram``; where they have no GPM, ``power_ratio``: each minute's
        power over that minute's limit)
        over their spinning minutes, on ``nodes`` (``node=~`` lists, split as
        :func:`_split`): of the devices spinning at every recorded minute of the history
        (:meth:`run_queries`' first form), or (``trailing``) of those whose run began within
        it, over the run (``spinning_means_promql`` over :class:`History`), labelled
        ``stat="spin"`` and ``signal``. What a spinning device's row shows beyond its
        verdict: asked for the rows the page shows (``FleetData.read_spinning``)."""
        def build(names: Sequence[str]) -> str:
            hist = self._history(window, history_start,
                                 node_matchers(names, self.cluster_label), trailing)
            return " or ".join(labelled(labelled(q, "signal", key), "stat", "spin")
                               for key, q in spinning_means_promql(hist).items())

        return {f"runs#{i}": q for i, q in enumerate(_split(sorted(set(nodes)), build))}

    #: Whether the fleet page asks the recording rules for run summaries (:meth:`run_queries`)
    #: where it can; False: every finding's steps (the same verdicts, slower; for tests).
    summaries = True

    #: Whether the fleet page reads the idle devices, nodes and slices and the
    #: allocated-idle containers from the verdicts' run records where they cover its
    #: history (``dashboard/plan/entities.py``; needs :attr:`prices`). The same page;
    #: measured slower than the run summaries at 57 % and 95 % of 5,000 nodes on both
    #: stores (docs/benchmarks.md), so off: for tests and the benchmark's ``--records``.
    read_records = False

    def runs_recorded_since(self, window: Window) -> float | None:
        """Since when the rules have recorded the verdicts' runs without a gap
        (``gpuscope:dashboard_runs:since_seconds`` at the window's end; seconds since the
        epoch), None where they do not: a run read from them holds over a history that
        begins after it. One instant query. Raises
        :class:`~gpuscope.dashboard.data.source.DataError` where the store fails."""
        # (The latest, where a store holds several clusters' rules: runs hold after it.)
        rows = self.instant(f"max(last_over_time({RULES['runs_since']}[{RULE_R}]))",
                            window.end)
        return next((v for _, v in rows if math.isfinite(v)), None)

    def _submit(self, queries: Mapping[str, str], window: Window) -> _Answers:
        """Every query sent (at most :attr:`MAX_IN_FLIGHT` in flight, in this order), the
        answers to be read by role as they are needed (:class:`_Answers`)."""
        def one(name: str, promql: str) -> Any:
            role = name.partition("#")[0]
            if role in self.RANGE_QUERIES:
                return self.as_role(role, lambda: self.range(promql, window))
            return self.as_role(role, lambda: self.instant(promql, window.end))

        pending: dict[str, list[Future[Any]]] = {}
        for name, promql in queries.items():
            try:
                fut = self._page_pool.submit(one, name, promql)
            except RuntimeError:  # closed: a page still computing when the dashboard stops
                raise DataError(f"{self.description}: closed") from None
            pending.setdefault(name.partition("#")[0], []).append(fut)
        return _Answers(pending)

    def _full_history_at(self, window: Window) -> float:
        """The earliest time data must reach back to for the verdicts' history to begin at
        the window's start: one rate range before its first step's end (see
        :meth:`_history_start`)."""
        return window.start - max(window.step, 2 * self.lookback) + window.step

    def assumed_start(self, window: Window) -> float:
        """Where the verdicts' history begins when data reaches back far enough (the store
        is older than the window, as it usually is): the first round's ``now`` counts the
        idle devices' minutes over it, before the round says where data begins."""
        return self._history_start(window, self._full_history_at(window))

    def _history_start(self, window: Window, first: float | None) -> float:
        """Where the verdicts' history begins: a rate over the range r is the mean over r
        only once a series is r old (before, Prometheus divides what little increase there
        is by all of r), so the rate-based verdicts' history begins r after the data does."""
        if first is None:
            return window.end
        rate_range = max(window.step, 2 * self.lookback)
        return min(window.end, max(window.start, first - window.step + rate_range))
