"""The fleet page's plan of Prometheus queries, part one: the verdicts' PromQL forms
(:class:`Verdicts`), per step on the raw series or on the ``gpuscope-dashboard`` recording
rules (:class:`_Steps`), and the rules themselves (:func:`recording_rules`,
:func:`rules_yaml`), for the verdicts judged in the views; a verdict the registry judges
declares its own step queries and their recorded form in its module (``dashboard/verdicts/``),
and its rule here only where it is recorded (``uuid:gpu_throttle_any_ratio:rate2m``)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from gpuscope.dashboard.data.prometheus import (
    CLUSTER_LABEL,
    EDGE,
    _power_step,
    _rate,
    _util_step,
)
from gpuscope.dashboard.data.promql import duration, labelled, scoped, selector
from gpuscope.dashboard.verdicts import Thresholds


def _stat(expr: str, name: str) -> str:
    """One part of a query of several, its rows labelled ``stat="name"``."""
    return labelled(expr, "stat", name)


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
    "held": "workload:gpu_held:sum1m",
    "used": "workload:gpu_used:sum1m",
    "version": "gpuscope:dashboard_rules:version",
}
#: The rules' version, recorded as ``gpuscope:dashboard_rules:version``: raised whenever a
#: release adds a recorded series the page reads, so that a rule file older than the page
#: (which lacks it: sparse series cannot tell "nothing met the rule" from "not recorded")
#: leaves the page to the raw series instead of to a silent gap. The series carries the
#: thresholds the rules were made for (label ``thresholds``: ``Thresholds.key``): the page
#: reads only rules made for its own.
RULES_VERSION = 5
RULE_INTERVAL = 60.0
#: The window whose containers the rules describe (the page's default, an hour): over it the
#: page reads who uses what on the nodes that need it only (:meth:`PrometheusData.lean`).
#: The page reads the last minute recorded, up to a minute before its end: a container
#: seen only in that last minute, or only in the window's first, is missed there (too
#: short for any verdict; a device shared only then lacks its row in the shares' table).
LEAN_WINDOW = 3600.0
#: How far outside the input-starved range a container's recorded mean may be and still be
#: asked about: the recorded hour and the page's differ by at most a minute at each end and
#: a sample on the boundary, 3 samples of 60 at a one-minute scrape, so the means by at most
#: 0.05. The page judges the exact mean of its own window. A mean of 0 is never asked about
#: (strictly above the bound): an hour at exactly 0 is not input-starved a minute later.
INPUT_MARGIN = 0.05
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


class _Steps:
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
        pods = self.sel("gpu_pod_info", {"workload": NOT_EMPTY})
        mine = (f"sum by (node, uuid, namespace, workload) ({self.cutil()}"
                f" * on (node, namespace, pod) group_left (workload)"
                f" topk by (node, namespace, pod) (1, {pods}))")
        if not (model or compute):
            return mine
        info = self.sel("gpu_info")
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
        held = (f"(max by ({CBY}) (max_over_time("
                f"{self.sel('container_gpu_allocated', {'namespace': NOT_EMPTY})}"
                f"[{self.r}])) > 0)")
        share = f"({held} / on (node, uuid) group_left () count by (node, uuid) ({held}))"
        pods = (f"topk by (node, namespace, pod) (1, max by (node, namespace, pod, workload)"
                f" (max_over_time({self.sel('gpu_pod_info')}[{self.r}])))")
        return (f"({share} * on (node, namespace, pod) group_left (workload) {pods}"
                f" or {share} unless on (node, namespace, pod) {pods})")

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

    def cutil(self) -> str:
        """Each container's mean utilization of each device it uses."""
        if self.rules:
            return self._recorded("avg_over_time", "cutil", CBY)
        cutil = self.sel("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})
        return f"max by ({CBY}) (avg_over_time({cutil}[{self.r}]))"


class Verdicts:
    """The verdicts' rules as PromQL over :class:`_Steps`: what meets each at a step. The
    fleet page applies them to the window's end (what to ask the history of) and, without
    the recording rules, per step; the ``gpuscope-dashboard`` rules record them every
    minute (:func:`recording_rules`)."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.th = thresholds

    def idle_parts(self, st: _Steps) -> list[str]:
        """Each device's idle activity below the threshold, labelled with its ``signal``:
        utilization (whole GPUs, slices that report it without GPM), SM activity (MIG slices
        with GPM), or (a MIG slice without either) 0 while no process holds memory on it.
        A device meets at most one of them."""
        idle = f"{self.th.idle_utilization!r}"
        util = st.sel("gpu_utilization_ratio")
        gpm = st.sel("gpu_sm_active_seconds_total")
        slices = st.sel("gpu_info", {"parent_uuid": NOT_EMPTY})
        cmem = st.sel("container_gpu_memory_used_bytes")
        memory = st.sel("gpu_memory_used_bytes")
        return [
            f'label_replace({st.util_max()} < {idle}'
            f' unless on (node, uuid) ({gpm} and on (node, uuid) {slices}),'
            f' "signal", "utilization", "", "")',
            f'label_replace({st.active("sm")} < {idle}'
            f' and on (node, uuid) {slices}, "signal", "sm", "", "")',
            f'label_replace(max by ({GBY}) (max_over_time({memory}[{st.r}]))'
            f' * 0 and on (node, uuid) {slices} unless on (node, uuid) {util}'
            f' unless on (node, uuid) {gpm}'
            f' unless on (node, uuid) (max by (node, uuid) (max_over_time({cmem}[{st.r}])) > 0),'
            f' "signal", "process", "", "")',
        ]

    def spinning(self, st: _Steps) -> str:
        """The devices that spin (busy by utilization, no work: with GPM, SM, tensor and
        DRAM activity below the rule's; without, power below its share of the limit);
        value: the utilization. :mod:`..analysis.spinning`'s rule."""
        rule = self.th.spin_rule
        sm = st.active("sm")
        gpm = (f"({sm} < {rule.sm!r}) and on (node, uuid) ({st.active('tensor')} < "
               f"{rule.tensor!r}) and on (node, uuid) ({st.active('dram')} < {rule.dram!r})")
        power = (f"({st.power()} < on (node, uuid) ({rule.power!r} * {st.limit()}))"
                 f" unless on (node, uuid) {sm}")
        return (f"({st.util()} >= {rule.busy!r})"
                f" and on (node, uuid) (({gpm}) or on (node, uuid) ({power}))")

    def silent(self, st: _Steps) -> str:
        """The devices with nothing to judge them by: no utilization sample and no SM
        activity (GPM) in the step."""
        return (f"max by ({GBY}) ({st.sel('gpu_info')}) unless on (node, uuid)"
                f" max_over_time({st.sel('gpu_utilization_ratio')}[{st.r}])"
                f" unless on (node, uuid) {st.active('sm')}")

    def throttling(self, st: _Steps, over: str | None = None) -> str:
        """Each device's throttle seconds per second by reason where above 0 (any reason,
        any amount: a straggler's evidence, not a verdict), over ``over`` (default: the
        step's rate range)."""
        return (f"max by ({GBY}, reason) (rate({st.sel('gpu_throttle_seconds_total')}"
                f"[{over or st.rr}])) > 0")

    def held_parts(self, st: _Steps) -> list[str]:
        """Per container, what it uses of what it holds where that is below the idle
        threshold: the device's SM activity where it has GPM and one holder, else the
        container's utilization times the device's holders (its share of a time-sliced GPU),
        else (a MIG slice without GPM) 0 while it has no process there."""
        r = st.r
        idle = f"{self.th.idle_utilization!r}"
        ns = {"namespace": NOT_EMPTY}
        held = f"max by ({CBY}) (max_over_time({st.sel('container_gpu_allocated', ns)}[{r}]))"
        sole_gpm = (f"(({st.active('sm')}) and on (node, uuid)"
                    f" (count by (node, uuid) ({held}) == 1))")
        cutil_max = (f"max by ({CBY}) (max_over_time("
                     f"{st.sel('container_gpu_utilization_ratio', ns)}[{r}]))")
        cmem = st.sel("container_gpu_memory_used_bytes", ns)
        slices = st.sel("gpu_info", {"parent_uuid": NOT_EMPTY})
        gpm = st.sel("gpu_sm_active_seconds_total")
        return [
            f'label_replace({held} * on (node, uuid) group_left () ({sole_gpm} < {idle}),'
            f' "signal", "sm", "", "")',
            f'label_replace(({cutil_max} * on (node, uuid) group_left ()'
            f' count by (node, uuid) ({held}) < {idle}) and on ({CBY}) {held}'
            f' unless on (node, uuid) {sole_gpm}, "signal", "utilization", "", "")',
            f'label_replace((max by ({CBY}) (max_over_time({cmem}[{r}])) == 0)'
            f' and on ({CBY}) {held} and on (node, uuid) {slices}'
            f' unless on (node, uuid) {gpm} unless on ({CBY}) {cutil_max},'
            f' "signal", "process", "", "")',
        ]

    def candidate_parts(self, st: _Steps) -> list[str]:
        """The workloads (``namespace, workload``, ``kind`` ``stalled`` or ``slow``) that
        may hold a straggler at a step: supersets of the rules of
        :mod:`..analysis.stragglers`, which the analysis applies to the history. A device of
        a workload is the summed utilization of the workload's containers on it. Stalled: a
        device below ``straggler_factor`` x the workload's highest (the median is at most
        that). Slow: every device busy, and the highest SM activity (else power)
        ``slow_factor`` x the lowest or more (the median is at least the lowest)."""
        th = self.th
        per = "by (namespace, workload)"
        devw = st.workload()
        stalled = (f"count {per} ({devw} < on (namespace, workload) group_left ()"
                   f" ({th.straggler_factor!r} * max {per} ({devw})))")
        work = f"({st.active('sm')} or on (node, uuid) {st.power()})"
        xw = f"({devw} * 0 + on (node, uuid) group_left () {work})"
        uw = f"({devw} * 0 + on (node, uuid) group_left () {st.util()})"
        slow = (f"count {per} ({xw}) >= 2 and on (namespace, workload)"
                f" (max {per} ({xw}) >= {th.slow_factor!r} * min {per} ({xw}))"
                f" and on (namespace, workload) (min {per} ({uw}) >= {th.slow_busy!r})")
        return [f'label_replace({stalled}, "kind", "stalled", "", "")',
                f'label_replace({slow}, "kind", "slow", "", "")']

    def candidates(self, st: _Steps) -> str:
        """:meth:`candidate_parts` as one expression."""
        return " or ".join(self.candidate_parts(st))

    # The stragglers' rules themselves, per minute (recorded: :func:`recording_rules`), as
    # :mod:`..analysis.stragglers` applies them to each step: a group is a workload's
    # devices of one GPU model (``model`` from ``gpu_info``, "" where a device has none);
    # a device, the summed utilization of the workload's containers on it (recorded with
    # its model: ``_Steps.workload(model=True)``); the median over
    # the group's devices present in that minute (``quantile(0.5)`` interpolates as
    # ``statistics.median`` does: the mean of the middle two of an even count).

    def stalled_median(self, st: _Steps) -> str:
        """Each group's median utilization, where it has two devices or more."""
        dev = st.workload(model=True)
        return (f"quantile by ({GROUP}) (0.5, {dev})"
                f" and on ({GROUP}) (count by ({GROUP}) ({dev}) >= 2)")

    def stalled(self, st: _Steps) -> str:
        """The devices below ``straggler_factor`` x their group's median (value: the
        device's utilization); reads the recorded median."""
        median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['stalled_median'])}[{st.r}]))"
        return (f"{st.workload(model=True)} < on ({GROUP}) group_left ()"
                f" ({self.th.straggler_factor!r} * {median})")

    def group_work(self, st: _Steps) -> str:
        """Per device of each group, its work: SM activity where every device of the group
        present has it (label ``signal="sm"``), else power (``signal="power"``). Recorded
        (``uuid:gpu_group_work:avg1m``) for the two rules that read it: written out in each,
        it read the devices' workload series some fifteen times a minute (the two: 10.6 s
        of Prometheus' CPU per evaluation at 5,000 nodes; the three since: 4.4 s)."""
        dev = st.workload(model=True)

        def of(expr: str) -> str:
            return f"({dev} * 0 + on (node, uuid) group_left () {expr})"

        sm = of(st.active("sm"))
        gpm = f"(count by ({GROUP}) ({sm}) == on ({GROUP}) count by ({GROUP}) ({dev}))"
        return (f'(label_replace({sm} and on ({GROUP}) {gpm}, "signal", "sm", "", "")'
                f' or label_replace({of(st.power())} unless on ({GROUP}) {gpm},'
                f' "signal", "power", "", ""))')

    def _recorded_work(self, st: _Steps) -> str:
        by = f"{MEMBER}, signal"
        return f"max by ({by}) (avg_over_time({st.sel(RULES['group_work'])}[{st.r}]))"

    def work_median(self, st: _Steps) -> str:
        """Each group's median work (:meth:`group_work`, recorded, label ``signal``) where
        the slow-rank rule can apply: two devices or more, every one busy (utilization >=
        ``slow_busy``) and with its work signal, and the median above 0."""
        dev, work = st.workload(model=True), self._recorded_work(st)
        n = f"count by ({GROUP}) ({dev})"
        busy = (f"count by ({GROUP}) (({dev} * 0 + on (node, uuid) group_left () {st.util()})"
                f" >= {self.th.slow_busy!r})")
        return (f"(quantile by ({GROUP}, signal) (0.5, {work}) > 0)"
                f" and on ({GROUP}) ({n} >= 2)"
                f" and on ({GROUP}) ({busy} == on ({GROUP}) {n})"
                f" and on ({GROUP}) (count by ({GROUP}) ({work}) == on ({GROUP}) {n})")

    def slow(self, st: _Steps) -> str:
        """The devices at ``slow_factor`` x their group's median work or more (value: the
        device's work, label ``signal``); reads the recorded median."""
        median = f"max by ({GROUP}) (avg_over_time({st.sel(RULES['work_median'])}[{st.r}]))"
        return (f"{self._recorded_work(st)} >= on ({GROUP}) group_left ()"
                f" ({self.th.slow_factor!r} * {median})")


def recording_rules(thresholds: Thresholds | None = None, cluster: str = CLUSTER_LABEL
                    ) -> list[tuple[str, str]]:
    """The ``gpuscope-dashboard`` group, ``(record, expr)`` in evaluation order: the raw
    expressions of :class:`_Steps` and :class:`Verdicts` over one minute (two for rates),
    the sparse verdicts computed from the dense signals recorded before them, every node
    keyed by ``cluster`` too (:func:`~gpuscope.dashboard.data.promql.scoped`). The version
    series says which thresholds and cluster label the rules were made for. The rule file
    holds the same text for the defaults (a test keeps the two equal)."""
    th = thresholds or Thresholds()
    v = Verdicts(th)
    raw = _Steps(RULE_R, RULE_RR)
    rec = _Steps(RULE_R, RULE_RR, rules=True)
    rules = [
        (RULES["util_max"], raw.util_max()),
        (RULES["util"], raw.util()),
        (RULES["sm"], raw.active("sm")),
        (RULES["tensor"], raw.active("tensor")),
        (RULES["dram"], raw.active("dram")),
        (RULES["power"], raw.power()),
        (RULES["cutil"], raw.cutil()),
        (RULES["workload"], rec.workload(compute=True)),
        (RULES["idle"], " or ".join(v.idle_parts(rec))),
        (RULES["spin"], v.spinning(rec)),
        (RULES["throttling"], v.throttling(raw)),
        (RULES["silent"], v.silent(raw)),
        (RULES["held_idle"], " or ".join(v.held_parts(rec))),
        (RULES["candidates"], v.candidates(rec)),
        (RULES["stalled_median"], v.stalled_median(rec)),
        (RULES["stalled"], v.stalled(rec)),
        (RULES["group_work"], v.group_work(rec)),
        (RULES["work_median"], v.work_median(rec)),
        (RULES["slow"], v.slow(rec)),
        (RULES["held_share"], raw.held_share()),
        (RULES["held"], rec.holdings()),
        (RULES["used"], rec.holdings(used=True)),
        (RULES["node_gpus"], f"count by (node) ({WHOLE_GPUS})"),
        (RULES["node_models"], "count by (node, model) (max by (node, uuid, model) (gpu_info))"),
        (RULES["node_util_sum"], f"sum by (node) ({_whole_util(rec)})"),
        (RULES["node_util_count"], f"count by (node) ({_whole_util(rec)})"),
        (RULES["cmean"],
         f"avg by ({CBY}) (avg_over_time({CUTIL}[{duration(LEAN_WINDOW)}]))"),
        (RULES["input_range"], f"{_cmean()} > {max(0.0, th.input_low - INPUT_MARGIN)!r}"
                               f" <= {th.input_high + INPUT_MARGIN!r}"),
        (RULES["sharers"], f"count by (node, uuid) ({_cmean()}) >= 2"),
        (RULES["version"],
         f'label_replace(label_replace(vector({RULES_VERSION}), "thresholds", "{th.key}", "",'
         f' ""), "cluster_label", "{cluster}", "", "")'),
    ]
    # Every node its cluster's, where the store holds several (an absent label groups as
    # before: one cluster's rules record what they did).
    return [(record, scoped(expr, cluster)) for record, expr in rules]


#: Every container's utilization of a device (the raw gauge).
CUTIL = selector("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})


def _cmean() -> str:
    """The recorded containers' means, as the rules after it read them."""
    return f"max by ({CBY}) (last_over_time({RULES['cmean']}[{RULE_R}]))"


#: Each whole GPU once (a GPU in MIG mode too; not its slices), by node and uuid.
WHOLE_GPUS = 'max by (node, uuid) (gpu_info{parent_uuid=""})'


def _whole_util(st: _Steps) -> str:
    """Each whole GPU's mean utilization in the step, by node and uuid (a NaN left out: the
    page's device means leave it out too)."""
    return f"(max by (node, uuid) ({st.util()}) >= 0) and on (node, uuid) {WHOLE_GPUS}"


#: The most nodes the page reads from the raw series (without the recording rules) in
#: about a second: docs/benchmarks.md (500 nodes: 0.7 s; 5,000: several seconds). Beyond
#: it the page says how to load the rules.
RAW_NODES = 1000
RAW_NOTE = ("This fleet has {nodes:,} nodes: without the gpuscope-dashboard recording rules the "
            "page reads every device's raw series, which grows slow beyond {most:,} nodes. Load "
            "the rules made for this page's thresholds into your Prometheus or vmalert "
            "(gpuscope-dashboard --print-rules prints them; docs/dashboard.md, \"Recording "
            "rules\").")


def rules_yaml(thresholds: Thresholds | None = None, cluster: str = CLUSTER_LABEL) -> str:
    """The ``gpuscope-dashboard`` group as it stands in alerts/gpuscope-rules.yaml (each
    expression folded to 88 columns): ``gpuscope-dashboard --print-rules`` prints it for
    its thresholds and cluster label."""
    out = ["  - name: gpuscope-dashboard", "    interval: 1m", "    rules:"]
    for record, expr in recording_rules(thresholds, cluster):
        out += [f"      - record: {record}", "        expr: >-",
                textwrap.indent(textwrap.fill(expr, 88, break_long_words=False,
                                              break_on_hyphens=False), " " * 10)]
    return "\n".join(out) + "\n"

