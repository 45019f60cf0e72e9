"""The ``gpuscope-dashboard`` recording rules' series, and each device's and container's signals
per step as PromQL (:class:`Steps`): from the raw series, or from those rules where they are
loaded. The verdict modules (``dashboard/verdicts/``) write their PromQL forms over
:class:`Steps`; ``dashboard/plan/`` sends them and composes the rule file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscope.dashboard.data.prometheus import EDGE, _power_step, _rate, _util_step
from gpuscope.dashboard.data.promql import duration, selector

#: The ``gpuscope-dashboard`` recording rules (alerts/gpuscope-rules.yaml), evaluated every
#: :data:`RULE_INTERVAL` seconds: per device and container, the signals of one minute
#: (dense), and what meets a verdict's rule in that minute (sparse: a series only while
#: it does). Their expressions are :func:`recording_rules`, the raw queries' own.
RULES = {
    "util_max": "uuid:gpu_utilization_ratio:max1m",
    "util": "uuid:gpu_busy_ratio:rate2m",
    "sm": "uuid:gpu_sm_active_ratio:rate2m",
    "tensor": "uuid:gpu_tensor_active_ratio:rate2m",
    "dram": "uuid:gpu_dram_active_ratio:rate2m",
    "power": "uuid:gpu_power_watts:rate2m",
    "cutil": "container:gpu_utilization_ratio:avg1m",
    "idle": "uuid:gpu_idle_activity:ratio1m",
    "spin": "uuid:gpu_spinning_utilization:ratio1m",
    "throttling": "uuid:gpu_throttle_any_ratio:rate2m",
    "silent": "uuid:gpu_silent:info1m",
    "held_idle": "container:gpu_held_idle_usage:ratio1m",
    "workload": "uuid:gpu_workload_utilization:sum1m",
    "candidates": "workload:gpu_straggler_candidates:count1m",
    "stalled_median": "workload:gpu_workload_utilization:median1m",
    "stalled": "uuid:gpu_stalled_utilization:ratio1m",
    "group_work": "uuid:gpu_group_work:avg1m",
    "work_median": "workload:gpu_work:median1m",
    "slow": "uuid:gpu_slow_work:ratio1m",
    # Per node (5,000 series at 5,000 nodes where the devices' are 35,000): what the fleet
    # page needs of the nodes where no verdict has anything to show (NodeSummary).
    "node_gpus": "node:gpu_whole:count1m",
    "node_models": "node:gpu_model:count1m",
    "node_util_sum": "node:gpu_busy_ratio:sum1m",
    "node_util_count": "node:gpu_busy_ratio:count1m",
    # Who uses what over the default window (:data:`LEAN_WINDOW`), so that the page need not
    # read every container's series: each container's raw mean over the last hour (dense,
    # read by the two after it alone), the containers whose mean is near the input-starved
    # range and the devices two containers or more used (sparse).
    "cmean": "container:gpu_utilization_ratio:avg1h",
    "input_range": "container:gpu_input_range:avg1h",
    "sharers": "uuid:gpu_sharers:count1h",
    # Who held what (the showback): per node, namespace, workload (and MIG slice), the
    # devices held (a time-slice's holder 1/n of its GPU) and the use of them, each minute.
    "held_share": "container:gpu_held_share:max1m",
    # The idle or spinning devices a container held in the minute (sparse): what the page
    # counts over the history for the waste split, reading the idle devices' series alone
    # instead of every holder's.
    "idle_held": "uuid:gpu_idle_held:count1m",
    "held": "workload:gpu_held:sum1m",
    "used": "workload:gpu_used:sum1m",
    # Each verdict's trailing runs as they go (``dashboard/verdicts/runs.py``), sparse: per
    # flagged series, when its run began (seconds since the epoch), how many minutes it
    # has held, and running sums over them.
    "idle_run_since": "uuid:gpu_idle_run:since_seconds",
    "idle_run_minutes": "uuid:gpu_idle_run:minutes",
    "idle_run_held_sum": "uuid:gpu_idle_run_held:minutes",
    "idle_run_spun_sum": "uuid:gpu_idle_run_spinning:minutes",
    "spin_run_since": "uuid:gpu_spinning_run:since_seconds",
    "spin_run_minutes": "uuid:gpu_spinning_run:minutes",
    "spin_run_utilization_sum": "uuid:gpu_spinning_run_utilization:sum",
    "alloc_run_since": "container:gpu_allocated_idle_run:since_seconds",
    "alloc_run_minutes": "container:gpu_allocated_idle_run:minutes",
    "alloc_run_usage_sum": "container:gpu_allocated_idle_run_usage:sum",
    "stalled_run_since": "uuid:gpu_stalled_run:since_seconds",
    "stalled_run_minutes": "uuid:gpu_stalled_run:minutes",
    "stalled_run_value_sum": "uuid:gpu_stalled_run_utilization:sum",
    "stalled_run_median_sum": "uuid:gpu_stalled_run_median:sum",
    "slow_run_since": "uuid:gpu_slow_run:since_seconds",
    "slow_run_minutes": "uuid:gpu_slow_run:minutes",
    "slow_run_value_sum": "uuid:gpu_slow_run_work:sum",
    "slow_run_median_sum": "uuid:gpu_slow_run_median:sum",
    # Per node all of whose whole GPUs are in an idle run (no MIG): how many, their runs'
    # latest, earliest and summed first minutes, and their held and spinning minutes summed
    # (the page's idle nodes and waste from a node's numbers, not its GPUs').
    "node_idle_gpus": "node:gpu_idle_run:gpus",
    "node_idle_since_max": "node:gpu_idle_run:since_max_seconds",
    "node_idle_since_min": "node:gpu_idle_run:since_min_seconds",
    "node_idle_since_sum": "node:gpu_idle_run:since_sum_seconds",
    "node_idle_held_sum": "node:gpu_idle_run_held:minutes",
    "node_idle_spun_sum": "node:gpu_idle_run_spinning:minutes",
    # Each MIG slice's compute slices (its profile's), and each allocated-idle container's
    # share of its GPU's price in the minute (a slice's share; else 1 / the device's users
    # over the last hour): what its row's $/hour is.
    "mig_slices": "uuid:gpu_mig_compute_slices:count",
    "alloc_share": "container:gpu_allocated_idle_share:ratio1h",
    # Per straggler group with a stalled or slow device in the minute, its devices over the
    # last hour on each node in whole GPUs (what its row's "GPUs' $/hour" adds up).
    "group_gpus": "workload:gpu_straggler_group_gpus:sum1h",
    # Since when the runs have been recorded without a gap (dense, one series): the page
    # reads a run only where its window's history lies after that.
    "runs_since": "gpuscope:dashboard_runs:since_seconds",
    "version": "gpuscope:dashboard_rules:version",
}
#: The rules' version, recorded as ``gpuscope:dashboard_rules:version``: raised whenever a
#: release adds a recorded series the page reads, so that a rule file older than the page
#: (which lacks it: sparse series cannot tell "nothing met the rule" from "not recorded")
#: leaves the page to the raw series instead of to a silent gap. The series carries the
#: thresholds the rules were made for (label ``thresholds``: ``Thresholds.key``): the page
#: reads only rules made for its own.
RULES_VERSION = 6
RULE_INTERVAL = 60.0
#: The rules' windows: a minute for gauges, two for counters (a rate needs two samples, and a
#: one-minute scrape gives one per minute).
RULE_R = duration(RULE_INTERVAL - EDGE)
RULE_RR = duration(2 * RULE_INTERVAL - EDGE)

NOT_EMPTY = '!=""'
CBY = "node, namespace, pod, container, uuid"
GBY = "node, gpu, uuid"
#: A straggler group: the devices of one workload and GPU model (:mod:`..analysis.stragglers`).
GROUP = "namespace, workload, model"
#: One device of a straggler group.
MEMBER = f"node, uuid, {GROUP}"


class Steps:
    """Per step, each device's and container's signals on the nodes ``match`` names (all
    without it): gauges over ``r``, counters' rates over ``rr`` (two scrape intervals at
    least). From the raw series, or (``rules``) the ``gpuscope-dashboard`` recording rules:
    the mean (``avg_over_time``) or highest (``max_over_time``) of the step's minutes,
    the same values as the raw ones when the step is a minute and the rules were evaluated
    on the step's times (approximately so otherwise)."""

    def __init__(self, r: str, rr: str, rules: bool = False,
                 match: Mapping[str, str] | None = None) -> None:
        self.r = r
        self.rr = rr
        self.rules = rules
        self.match = dict(match or {})

    def sel(self, metric: str, extra: Mapping[str, str] | None = None) -> str:
        """``metric`` on this step's nodes, with ``extra`` matchers."""
        return selector(metric, {**self.match, **(extra or {})})

    def _recorded(self, fn: str, key: str, by: str = GBY) -> str:
        return f"max by ({by}) ({fn}({self.sel(RULES[key])}[{self.r}]))"

    def util_max(self) -> str:
        """The highest utilization sample in the step (a step is idle when below)."""
        if self.rules:
            return self._recorded("max_over_time", "util_max")
        return f"max by ({GBY}) (max_over_time({self.sel('gpu_utilization_ratio')}[{self.r}]))"

    def util(self) -> str:
        """Mean utilization: busy counter, else the gauge."""
        if self.rules:
            return self._recorded("avg_over_time", "util")
        return _util_step(self.rr, self.match)

    def active(self, name: str) -> str:
        """GPM ``sm``/``tensor``/``dram`` activity."""
        if self.rules:
            return self._recorded("avg_over_time", name)
        return _rate(f"gpu_{name}_active_seconds_total", self.rr, self.match)

    def power(self) -> str:
        """Mean watts: energy counter, else the gauge."""
        if self.rules:
            return self._recorded("avg_over_time", "power")
        return _power_step(self.rr, self.match)

    def limit(self) -> str:
        return f"max by ({GBY}) (max_over_time({self.sel('gpu_power_limit_watts')}[{self.r}]))"

    def workload(self, compute: bool = False, model: bool = False) -> str:
        """Per device and workload (``node, uuid, namespace, workload``), the summed
        utilization of the workload's containers on the device (``compute``: from the
        containers' signals even with ``rules``, as the rule recording it does, with the
        device's ``model``). ``model``: with the device's GPU model (from ``gpu_info``, ""
        where it has none): per device of each straggler group (:data:`MEMBER`)."""
        by = MEMBER if model else "node, uuid, namespace, workload"
        if self.rules and not compute:
            return self._recorded("avg_over_time", "workload", by)
        # Pods and models over the step (``max_over_time``), not at its end: a failed
        # scrape's staleness markers hide every series of the node there, and the workload
        # had no devices in that step (a gap that began every straggler run again).
        pods = f"max_over_time({self.sel('gpu_pod_info', {'workload': NOT_EMPTY})}[{self.r}])"
        mine = (f"sum by (node, uuid, namespace, workload) ({self.cutil()}"
                f" * on (node, namespace, pod) group_left (workload)"
                f" topk by (node, namespace, pod) (1, {pods}))")
        if not (model or compute):
            return mine
        info = f"max_over_time({self.sel('gpu_info')}[{self.r}])"
        models = f"topk by (node, uuid) (1, max by (node, uuid, model) ({info}))"
        return (f"({mine} * on (node, uuid) group_left (model) {models}"
                f" or {mine} unless on (node, uuid) {info})")

    def held_share(self) -> str:
        """Each container's share of the device it holds in the step
        (``container_gpu_allocated``: each of ``n`` holders ``1/n``), labelled with its
        pod's ``workload`` (from ``gpu_pod_info``; none for a pod without one). Recorded
        (``container:gpu_held_share:max1m``): the showback's two rules read it."""
        if self.rules:
            return self._recorded("max_over_time", "held_share", f"{CBY}, workload")
        share = self._share()
        pods = (f"topk by (node, namespace, pod) (1, max by (node, namespace, pod, workload)"
                f" (max_over_time({self.sel('gpu_pod_info')}[{self.r}])))")
        return (f"({share} * on (node, namespace, pod) group_left (workload) {pods}"
                f" or {share} unless on (node, namespace, pod) {pods})")

    def _held(self) -> str:
        """Each container holding a device in the step (its allocation above 0), raw."""
        alloc = self.sel("container_gpu_allocated", {"namespace": NOT_EMPTY})
        return f"(max by ({CBY}) (max_over_time({alloc}[{self.r}])) > 0)"

    def _share(self) -> str:
        """Each holder's share of its device in the step (``1/n`` of ``n`` holders), raw."""
        held = self._held()
        return f"({held} / on (node, uuid) group_left () count by (node, uuid) ({held}))"

    def holdings(self, used: bool = False) -> str:
        """Who holds what in the step (the showback, :class:`~gpuscope.dashboard.series.
        Holding`): per node, namespace and workload, the devices its containers hold
        (:meth:`held_share`), or with ``used`` their utilization of them while they hold
        them; the whole GPUs together, each MIG slice on its own (label ``uuid``: the page
        prices it at its share of its GPU)."""
        mine = self.held_share()
        if used:
            cutil = self.sel("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})
            mine = (f"(max by ({CBY}) (avg_over_time({cutil}[{self.r}]))"
                    f" * on ({CBY}) group_left (workload) ({mine} > bool 0))")
        slices = (f"max by (node, uuid) (max_over_time("
                  f"{self.sel('gpu_info', {'parent_uuid': NOT_EMPTY})}[{self.r}]))")
        return (f"sum by (node, namespace, workload) ({mine} unless on (node, uuid) {slices})"
                f" or sum by (node, namespace, workload, uuid) ({mine} and on (node, uuid)"
                f" {slices})")

    def holdings_over(self, span: str, step: str, whole: str, used: bool = False) -> str:
        """Without the rules, who held what over a window (:meth:`holdings` summed over its
        steps): each container's share of the device it holds (``1/n`` of ``n`` holders),
        or with ``used`` its mean utilization of it while it holds it, summed over the
        steps of ``span`` at ``step`` (a subquery), and only then grouped by its pod's
        workload and, for a MIG slice, the slice (label ``uuid``), as the pods and slices
        of the window (``whole``: a range over it) say, as
        :func:`~gpuscope.dashboard.data.reduce.holdings` groups them. Grouped in every step
        instead (each step joining the pods and slices, the holders' expression written
        out four times), the two queries cost Prometheus 13 and 15 CPU-s at 1,000 nodes;
        this way 2.4 and 1.8 (``docs/benchmarks.md``, without the recording rules)."""
        each = f"{self.cutil()} and on ({CBY}) {self._held()}" if used else self._share()
        summed = f"sum_over_time(({each})[{span}:{step}])"
        alloc = self.sel("container_gpu_allocated", {"namespace": NOT_EMPTY})
        # Every pod held a device: its workload where its info names one (``topk``: one
        # where replicas disagree), else none; every device: the slice, where it is one.
        ever = f"last_over_time({alloc}[{whole}])"
        pods = (f"(group by (node, namespace, pod, workload) (topk by (node, namespace, pod)"
                f" (1, max by (node, namespace, pod, workload) (last_over_time("
                f"{self.sel('gpu_pod_info')}[{whole}]))))"
                f" or on (node, namespace, pod) group by (node, namespace, pod) ({ever}))")
        slices = (f"(label_replace(group by (node, uuid) (last_over_time("
                  f"{self.sel('gpu_info', {'parent_uuid': NOT_EMPTY})}[{whole}])),"
                  f' "slice", "$1", "uuid", "(.*)")'
                  f" or on (node, uuid) group by (node, uuid) ({ever}))")
        owned = (f"{summed} * on (node, namespace, pod) group_left (workload) {pods}"
                 f" * on (node, uuid) group_left (slice) {slices}")
        return (f'label_replace(sum by (node, namespace, workload, slice) ({owned}),'
                f' "uuid", "$1", "slice", "(.*)")')

    def cutil(self) -> str:
        """Each container's mean utilization of each device it uses."""
        if self.rules:
            return self._recorded("avg_over_time", "cutil", CBY)
        cutil = self.sel("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})
        return f"max by ({CBY}) (avg_over_time({cutil}[{self.r}]))"


@dataclass(frozen=True)
class History:
    """The verdicts' history in the recorded minutes, for the run summaries: each finding
    whose sparse series has a sample at every minute of ``(history start, end]`` (one
    sample a minute) is one number instead of its steps. ``h``: a range over the history
    (its length less a millisecond); ``n``: its minutes; ``r``: the last step's range (the
    window's); ``match``: the nodes (or namespace) a form is asked of (all without it);
    ``end``: the history's end (seconds since the epoch, a whole minute), for the runs that
    began within it (:meth:`trailing`); ``to_end``: the forms ask for every run up to the
    end (:meth:`run`), not only the whole history's (a run that began within it is its steps
    from the first step all of whose minutes it holds)."""

    h: str
    n: int
    r: str
    match: Mapping[str, str] = field(default_factory=dict)
    end: float = 0.0
    to_end: bool = False

    def run(self, key: str, by: str) -> str:
        """The series of ``key``, aggregated ``by``, that the page can take as a run, with
        its minutes: with :attr:`to_end`, every run up to the end (:meth:`trailing`), else
        those of the whole history (:meth:`whole`)."""
        return self.trailing(key, by) if self.to_end else self.whole(key, by)

    def sel(self, key: str) -> str:
        """The recorded series ``key`` (of :data:`RULES`) on this history's nodes."""
        return selector(RULES[key], self.match)

    def held(self, key: str, by: str, everywhere: bool = False) -> str:
        """The series of ``key`` a run summary's means are asked of: those that held at
        every minute of the history (:meth:`whole`), or (:attr:`to_end`) every one at
        the end (:meth:`at_end`; which of them are runs, and how long, is :meth:`run`'s
        answer beside it)."""
        return self.at_end(key, everywhere) if self.to_end else self.whole(key, by)

    def at_end(self, key: str, everywhere: bool = False) -> str:
        """The series of ``key`` with a sample in the last step (the window's range); of
        every node where ``everywhere`` (a sparse series joined to a form already on this
        history's nodes: the node list once in the query, not twice)."""
        sel = selector(RULES[key]) if everywhere else self.sel(key)
        return f"last_over_time({sel}[{self.r}])"

    def minutes(self, key: str, by: str) -> str:
        """Each series of ``key``, aggregated ``by``, with its samples in the history (its
        recorded minutes)."""
        return f"max by ({by}) (count_over_time({self.sel(key)}[{self.h}]))"

    def whole(self, key: str, by: str) -> str:
        """The series of ``key``, aggregated ``by``, with a sample at every step."""
        return f"({self.minutes(key, by)} == {self.n})"

    def trailing(self, key: str, by: str) -> str:
        """The series of ``key``, aggregated ``by``, whose samples in the history are one a
        minute from their first to the end (none missing, none twice), with how many there
        are (their minutes: :attr:`n` where the run is the whole history's). Their first
        minute: a subquery at the rules' interval over the history's minutes (each read
        over that minute alone, as a one-minute step reads it), its value the minute's own
        time (``time()``) where the series has a sample, the least of them; ``c`` samples
        run from it to the end without a gap when ``(end - first) / 1m + 1 == c``. (The
        subquery reads each minute's sample once: a bare selector's five-minute look-back
        made Prometheus read every sample five times, 0.9 s for 6,500 series.)"""
        sel = self.sel(key)
        count = self.minutes(key, by)
        first = (f"min by ({by}) (min_over_time((last_over_time({sel}[{RULE_R}]) * 0 + time())"
                 f"[{self.h}:{duration(RULE_INTERVAL)}]))")
        return f"({count} == ({self.end:.3f} - {first}) / {RULE_INTERVAL:g} + 1)"

    def mean(self, key: str, by: str) -> str:
        """The mean of ``key``'s samples over the history, aggregated ``by``."""
        return f"max by ({by}) (avg_over_time({self.sel(key)}[{self.h}]))"

    def mean_while(self, key: str, flag: str, by: str) -> str:
        """The mean of the dense series ``key`` over the minutes of the history at which the
        sparse series ``flag`` has a sample (per device, ``node`` and ``uuid``), aggregated
        ``by``: a subquery at the rules' interval, each minute's sample of each read over
        that minute alone (as a one-minute step reads them); over the whole history
        (:meth:`mean`) unless :attr:`to_end`."""
        if not self.to_end:
            return self.mean(key, by)
        # (The sparse flag of every node: the dense series is on this history's nodes.)
        return (f"max by ({by}) (avg_over_time((avg_over_time({self.sel(key)}[{RULE_R}])"
                f" and on (node, uuid) last_over_time({selector(RULES[flag])}[{RULE_R}]))"
                f"[{self.h}:{duration(RULE_INTERVAL)}]))")

    def ratio_while(self, key: str, limit: str, flag: str, by: str) -> str:
        """The mean of each minute's ratio of the dense series ``key`` to the gauge
        ``limit`` (its highest sample in the minute, per device: a rule comparing the two
        minute by minute reads them so, as power against its power limit), over the minutes
        of the history at which the sparse series ``flag`` has a sample (with
        :attr:`to_end`; every minute of the history otherwise, each one flagged), aggregated
        ``by``: a subquery at the rules' interval, as :meth:`mean_while`. The mean of ``key``
        over the limit's highest in the range read a run under a limit changed within it
        against the limit of its last minutes alone."""
        ratio = (f"avg_over_time({self.sel(key)}[{RULE_R}]) / on (node, uuid) group_left ()"
                 f" max by (node, uuid) (max_over_time({selector(limit, self.match)}"
                 f"[{RULE_R}]))")
        if self.to_end:
            # (The sparse flag of every node: the dense series is on this history's nodes.)
            ratio = (f"({ratio}) and on (node, uuid)"
                     f" last_over_time({selector(RULES[flag])}[{RULE_R}])")
        return (f"max by ({by}) (avg_over_time(({ratio})"
                f"[{self.h}:{duration(RULE_INTERVAL)}]))")
