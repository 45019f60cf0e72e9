"""``gpuscope-alarms plan|apply``: CloudWatch alarms for the headline GPU cases.

The CloudWatch twin of the Prometheus rules, on the metrics gpuscope's CloudWatch sink
publishes in the ``CWAgent`` namespace (the CloudWatch agent's ``nvidia_smi_*`` names and
dimensions, plus ``ClusterName``; Container Insights' ``node_gpu_utilization``). Every alarm's
metrics carry the cluster's ``ClusterName``. Per GPU node of one cluster:

- ``GpuNodeUnderutilized``: the node's busiest GPU stays below the idle threshold (5 %) for an
  hour: ``node_gpu_utilization`` with the Maximum statistic (the sink publishes one value per
  device, so its Maximum is the busiest device), or, for a node without that rollup, metric
  math ``MAX(METRICS())`` over its ``nvidia_smi_utilization_gpu`` series. A node with a GPU
  in MIG mode gets none: a MIG GPU reports no utilization, so the node's activity is unknown
  (the Prometheus rules and the dashboard say the same).
- ``GpuTemperatureHigh``: its hottest GPU (``MAX(METRICS())`` over
  ``nvidia_smi_temperature_gpu``) above 85 °C for two 5-minute periods.
- ``GpuSpinning`` (nodes that publish GPM activity: Hopper and newer, with the node rollups):
  every GPU of the node busy (its least busy at least 50 % utilization) while the busiest does
  no work (SM activity below 30 %, tensor activity below 2 %) for 30 minutes: a job hung in a
  collective holds the whole node at "100 %". Metric math over ``node_gpu_utilization``
  (Minimum), ``node_gpu_sm_active`` and ``node_gpu_tensor_active`` (Maximum).

Nodes are found with ``ListMetrics`` (metrics with data in the last 3 hours, dimension
``ClusterName``), so the alarms follow the node pool. ``plan`` prints what ``apply`` would
change; ``apply`` creates or updates only alarms that differ from ``DescribeAlarms`` (a second
``apply`` changes nothing). Alarms of nodes that stopped publishing, and alarms that a node
still publishing no longer gets, are reported as stale and deleted only with ``--prune``; only
alarms tagged ``managed-by=gpuscope-alarms`` (as ``apply`` creates them) are ever deleted.

Bad input ends in one ``gpuscope-alarms: error: ...`` line and exit code 2; an AWS error in one
such line and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TextIO, cast

from gpuscope.exporter.config import endpoint_url
from gpuscope.exporter.flags import version

PROG = "gpuscope-alarms"
RUNBOOK = "docs/alerts.md#cloudwatch-alarms"
PERIOD = 300  # seconds: CloudWatch's standard resolution for alarms on agent metrics
# CloudWatch allows at most 10 metrics in a metric-math alarm: 9 GPUs plus the expression.
MAX_GPU_QUERIES = 9

GPU_UTILIZATION = "nvidia_smi_utilization_gpu"
GPU_TEMPERATURE = "nvidia_smi_temperature_gpu"
GPU_MEMORY_USED = "nvidia_smi_memory_used"  # every device publishes it, MIG slices included
NODE_UTILIZATION = "node_gpu_utilization"
NODE_SM_ACTIVE = "node_gpu_sm_active"          # GPM, Hopper and newer
NODE_TENSOR_ACTIVE = "node_gpu_tensor_active"
# The spinning rule (DESIGN.md, the Prometheus rules and the dashboard use the same).
SPIN_BUSY = 50.0     # percent utilization, of the node's least busy GPU
SPIN_SM = 30.0       # percent SM activity, of its busiest GPU
SPIN_TENSOR = 2.0    # percent tensor activity, of its busiest GPU

_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SNS_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")


class UsageError(Exception):
    """Bad input; ``str()`` is the one line to print."""


class CloudWatch(Protocol):
    """The part of boto3's CloudWatch client this module uses."""

    def list_metrics(self, **kwargs: Any) -> dict[str, Any]: ...
    def describe_alarms(self, **kwargs: Any) -> dict[str, Any]: ...
    def put_metric_alarm(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_alarms(self, **kwargs: Any) -> dict[str, Any]: ...
    def list_tags_for_resource(self, **kwargs: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Options:
    command: str
    cluster: str
    region: str | None = None
    endpoint_url: str | None = None
    namespace: str = "CWAgent"
    sns_topic_arn: str | None = None
    nodes: tuple[str, ...] = ()
    idle_threshold: float = 5.0
    idle_minutes: int = 60
    temperature: float = 85.0
    spin_minutes: int = 30
    prune: bool = False
    prefix: str = "gpuscope"

    @property
    def alarm_prefix(self) -> str:
        """Every alarm this cluster's run owns starts with it (the cluster name cannot hold a
        '/', so one cluster's prefix never matches another's alarms)."""
        return f"{self.prefix}/{self.cluster}/"


Dimensions = tuple[tuple[str, str], ...]


@dataclass
class NodeMetrics:
    """The dimension sets of the series one node publishes."""

    node: str
    node_utilization: list[Dimensions] = field(default_factory=list)
    gpu_utilization: list[Dimensions] = field(default_factory=list)
    gpu_temperature: list[Dimensions] = field(default_factory=list)
    gpu_memory: list[Dimensions] = field(default_factory=list)
    node_sm_active: list[Dimensions] = field(default_factory=list)
    node_tensor_active: list[Dimensions] = field(default_factory=list)
    #: ``nvidia_smi_memory_used`` under the agent's own set only (``host``, ``index``,
    #: ``name``, ``arch``: no ``ClusterName``), looked up for a node whose per-GPU metrics
    #: carry no ``ClusterName`` (``--cloudwatch-device-dimensions agent``). Used only to
    #: find MIG GPUs, never for an alarm's metrics (another cluster may have a node of the
    #: same name).
    agent_gpu_memory: list[Dimensions] = field(default_factory=list)

    def mig_gpus(self) -> list[str]:
        """GPUs in MIG mode: those with slices (index ``<gpu>/<instance>``), which publish
        memory whether or not they report utilization. A MIG GPU reports no utilization of
        its own, so the node's activity is not known."""
        return sorted({index.split("/")[0] for d in self.gpu_memory + self.agent_gpu_memory
                       if "/" in (index := dict(d).get("index", ""))}, key=_index_number)


def _index_number(index: str) -> tuple[int, str]:
    return (int(index) if index.isdigit() else 1 << 30, index)


@dataclass(frozen=True)
class Change:
    action: str  # create | update | delete | stale | foreign | unchanged
    name: str
    detail: str = ""
    alarm: dict[str, Any] | None = None


# ---- discovery -----------------------------------------------------------------------------

def _pages(call: Any, key: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    token: str | None = None
    while True:
        response = call(**kwargs, **({"NextToken": token} if token else {}))
        yield from response.get(key, [])
        token = response.get("NextToken")
        if not token:
            return


def _dims(metric: dict[str, Any]) -> Dimensions:
    return tuple(sorted((d["Name"], d["Value"]) for d in metric.get("Dimensions", [])))


#: Up to this many nodes publishing the agent's per-GPU set alone are looked up by host, one
#: ``ListMetrics`` each; more, with one listing of every host's.
AGENT_LOOKUPS_BY_HOST = 3


def discover(cw: CloudWatch, opts: Options) -> dict[str, NodeMetrics]:
    """Nodes of the cluster with recent GPU metrics, by node name (``NodeName``, or the
    per-GPU metrics' ``host``: the sink sets both to the Kubernetes node name).

    Every series found carries the cluster's ``ClusterName`` (the filter), so every alarm
    built on them does too. A node rollup is taken under gpuscope's node set only
    (``ClusterName``, ``NodeName``, ``InstanceType``): the sink also publishes it per cluster
    (no ``NodeName``: not a node's) and, with an instance ID, under Container Insights' set
    (``ClusterName``, ``NodeName``, ``InstanceId``), the same values again."""
    nodes: dict[str, NodeMetrics] = {}
    cluster_filter = [{"Name": "ClusterName", "Value": opts.cluster}]
    for metric_name, attr, node_dim in (
        (NODE_UTILIZATION, "node_utilization", "NodeName"),
        (GPU_UTILIZATION, "gpu_utilization", "host"),
        (GPU_TEMPERATURE, "gpu_temperature", "host"),
        (GPU_MEMORY_USED, "gpu_memory", "host"),
        (NODE_SM_ACTIVE, "node_sm_active", "NodeName"),
        (NODE_TENSOR_ACTIVE, "node_tensor_active", "NodeName"),
    ):
        for metric in _pages(cw.list_metrics, "Metrics", Namespace=opts.namespace,
                             MetricName=metric_name, Dimensions=cluster_filter,
                             RecentlyActive="PT3H"):
            dims = _dims(metric)
            named = dict(dims)
            node = named.get(node_dim)
            if not node or (opts.nodes and node not in opts.nodes):
                continue
            if node_dim == "NodeName" and "InstanceId" in named:
                continue  # Container Insights' node set: a copy of gpuscope's
            entry = nodes.setdefault(node, NodeMetrics(node))
            series: list[Dimensions] = getattr(entry, attr)
            if dims not in series:
                series.append(dims)
    # Node rollups but no per-GPU series with ClusterName: the exporter publishes the agent's
    # dimension set only. Its MIG slices must still be seen, or the node's rollup (which has
    # no MIG GPU in it) reads idle while a slice works. A few such nodes: asked by host; more:
    # one listing of every host's (ListMetrics allows some 25 calls a second).
    agent = {e.node: e for e in nodes.values() if e.node_utilization and not e.gpu_memory}
    by_host = ([[{"Name": "host", "Value": node}] for node in agent]
               if len(agent) <= AGENT_LOOKUPS_BY_HOST else [[]])
    for dimensions in by_host:
        for metric in _pages(cw.list_metrics, "Metrics", Namespace=opts.namespace,
                             MetricName=GPU_MEMORY_USED, Dimensions=dimensions,
                             RecentlyActive="PT3H"):
            dims = _dims(metric)
            named = dict(dims)
            holder = agent.get(named.get("host", ""))
            if (holder is not None and "ClusterName" not in named
                    and dims not in holder.agent_gpu_memory):
                holder.agent_gpu_memory.append(dims)
    for entry in nodes.values():
        for series in (entry.node_utilization, entry.gpu_utilization, entry.gpu_temperature,
                       entry.gpu_memory, entry.node_sm_active, entry.node_tensor_active):
            series.sort(key=_gpu_order)
    return nodes


def _gpu_order(dims: Dimensions) -> tuple[tuple[int, str], str]:
    return (_index_number(dict(dims).get("index", "")), repr(dims))


# ---- desired alarms ------------------------------------------------------------------------

def _dimension_list(dims: Dimensions) -> list[dict[str, str]]:
    return [{"Name": k, "Value": v} for k, v in dims]


def _metric(namespace: str, name: str, dims: Dimensions) -> dict[str, Any]:
    return {"Namespace": namespace, "MetricName": name, "Dimensions": _dimension_list(dims)}


def _busiest(namespace: str, name: str, series: list[Dimensions], label: str) -> list[Any]:
    queries: list[dict[str, Any]] = [
        {"Id": f"gpu{i}", "MetricStat": {"Metric": _metric(namespace, name, dims),
                                          "Period": PERIOD, "Stat": "Maximum"},
         "ReturnData": False}
        for i, dims in enumerate(series)
    ]
    queries.append({"Id": "busiest", "Expression": "MAX(METRICS())", "Label": label,
                    "ReturnData": True})
    return queries


def _base(opts: Options, name: str, description: str) -> dict[str, Any]:
    actions = [opts.sns_topic_arn] if opts.sns_topic_arn else []
    return {
        "AlarmName": name,
        "AlarmDescription": description,
        "ActionsEnabled": True,
        "AlarmActions": actions,
        "OKActions": actions,
        "InsufficientDataActions": [],
        "TreatMissingData": "notBreaching",
    }


def desired_alarms(opts: Options, nodes: dict[str, NodeMetrics]) -> tuple[
        list[dict[str, Any]], list[str]]:
    """The alarms the cluster should have (``PutMetricAlarm`` arguments, by name) and notes
    about nodes that could not get one."""
    alarms: list[dict[str, Any]] = []
    notes: list[str] = []
    periods = opts.idle_minutes * 60 // PERIOD
    threshold = f"{opts.idle_threshold:g}%"
    for node in sorted(nodes):
        m = nodes[node]
        name = f"{opts.alarm_prefix}{node}/GpuNodeUnderutilized"
        idle = _base(opts, name, (
            f"gpuscope: every GPU on node {node} (cluster {opts.cluster}) has stayed below "
            f"{threshold} utilization for {opts.idle_minutes} minutes. Runbook: {RUNBOOK}"))
        idle.update({"EvaluationPeriods": periods, "DatapointsToAlarm": periods,
                     "Threshold": opts.idle_threshold, "ComparisonOperator": "LessThanThreshold"})
        mig = m.mig_gpus()
        if mig:
            notes.append(f"{node}: no GpuNodeUnderutilized alarm: GPU {', '.join(mig)} in MIG "
                         "mode report(s) no utilization, so the node is never called idle")
        elif len(m.node_utilization) == 1:
            idle.update({"Namespace": opts.namespace, "MetricName": NODE_UTILIZATION,
                         "Dimensions": _dimension_list(m.node_utilization[0]),
                         "Statistic": "Maximum", "Period": PERIOD})
            alarms.append(idle)
        elif 0 < len(m.gpu_utilization) <= MAX_GPU_QUERIES:
            idle["Metrics"] = _busiest(opts.namespace, GPU_UTILIZATION, m.gpu_utilization,
                                       "busiest GPU utilization (%)")
            alarms.append(idle)
        else:
            notes.append(f"{node}: no GpuNodeUnderutilized alarm: {len(m.node_utilization)} "
                         f"{NODE_UTILIZATION} and {len(m.gpu_utilization)} {GPU_UTILIZATION} "
                         "series")
        if 0 < len(m.gpu_temperature) <= MAX_GPU_QUERIES:
            hot = _base(opts, f"{opts.alarm_prefix}{node}/GpuTemperatureHigh", (
                f"gpuscope: a GPU on node {node} (cluster {opts.cluster}) went above "
                f"{opts.temperature:g} °C in each of the last two 5-minute periods (their "
                f"maximum; not necessarily throughout). Runbook: {RUNBOOK}"))
            hot.update({"EvaluationPeriods": 2, "DatapointsToAlarm": 2,
                        "Threshold": opts.temperature,
                        "ComparisonOperator": "GreaterThanThreshold",
                        "Metrics": _busiest(opts.namespace, GPU_TEMPERATURE, m.gpu_temperature,
                                            "hottest GPU temperature (°C)")})
            alarms.append(hot)
        elif m.gpu_temperature:
            notes.append(f"{node}: no GpuTemperatureHigh alarm: {len(m.gpu_temperature)} "
                         f"{GPU_TEMPERATURE} series, more than {MAX_GPU_QUERIES}")
        elif not m.gpu_memory and not m.gpu_utilization:
            notes.append(f"{node}: no GpuTemperatureHigh alarm: its per-GPU metrics carry no "
                         "ClusterName (the exporter's --cloudwatch-device-dimensions is "
                         "'agent'; 'both' or 'extended' adds it)")
        # Nodes without GPM activity (before Hopper, or no node rollups) get no spinning
        # alarm; nor do MIG nodes (their slices report no utilization).
        if (not mig and len(m.node_utilization) == 1 and len(m.node_sm_active) == 1
                and len(m.node_tensor_active) == 1):
            alarms.append(_spinning(opts, node, m))
    return alarms, notes


def _spinning(opts: Options, node: str, m: NodeMetrics) -> dict[str, Any]:
    periods = opts.spin_minutes * 60 // PERIOD

    def stat(query_id: str, name: str, dims: Dimensions, statistic: str) -> dict[str, Any]:
        return {"Id": query_id, "MetricStat": {"Metric": _metric(opts.namespace, name, dims),
                                                "Period": PERIOD, "Stat": statistic},
                "ReturnData": False}

    alarm = _base(opts, f"{opts.alarm_prefix}{node}/GpuSpinning", (
        f"gpuscope: every GPU on node {node} (cluster {opts.cluster}) has been busy (at least "
        f"{SPIN_BUSY:g}% utilization) while doing no work (SM activity below {SPIN_SM:g}%, "
        f"tensor activity below {SPIN_TENSOR:g}%) for {opts.spin_minutes} minutes: a job hung "
        f"in a collective, or a busy-wait. Runbook: docs/alerts.md#gpuspinning"))
    alarm.update({
        "EvaluationPeriods": periods, "DatapointsToAlarm": periods, "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "Metrics": [
            stat("util", NODE_UTILIZATION, m.node_utilization[0], "Minimum"),
            stat("sm", NODE_SM_ACTIVE, m.node_sm_active[0], "Maximum"),
            stat("tensor", NODE_TENSOR_ACTIVE, m.node_tensor_active[0], "Maximum"),
            {"Id": "spinning", "ReturnData": True,
             "Label": "every GPU busy doing no work (1: yes)",
             "Expression": f"IF(util >= {SPIN_BUSY:g} AND sm < {SPIN_SM:g} AND "
                           f"tensor < {SPIN_TENSOR:g}, 1, 0)"},
        ],
    })
    return alarm


# ---- comparing -----------------------------------------------------------------------------

_COMPARED: dict[str, Any] = {
    "AlarmDescription": "", "ActionsEnabled": True, "AlarmActions": [], "OKActions": [],
    "InsufficientDataActions": [], "Namespace": None, "MetricName": None, "Statistic": None,
    "Dimensions": [], "Period": None, "Unit": None, "EvaluationPeriods": None,
    "DatapointsToAlarm": None, "Threshold": None, "ComparisonOperator": None,
    "TreatMissingData": "missing", "Metrics": [],
}


def _canonical_dims(dims: Any) -> Any:
    return sorted((d["Name"], d["Value"]) for d in dims or [])


def _canonical_query(q: dict[str, Any]) -> Any:
    stat = q.get("MetricStat")
    if stat:
        metric = stat.get("Metric", {})
        stat = (metric.get("Namespace"), metric.get("MetricName"),
                _canonical_dims(metric.get("Dimensions")), stat.get("Period"), stat.get("Stat"),
                stat.get("Unit"))
    return (q.get("Id"), q.get("Expression"), q.get("Label"), q.get("ReturnData", True), stat,
            q.get("Period"))


def canonical(alarm: dict[str, Any]) -> dict[str, Any]:
    """The compared fields of an alarm, as ``PutMetricAlarm`` arguments or a
    ``DescribeAlarms`` entry, in one comparable form (defaults filled in, lists sorted)."""
    out: dict[str, Any] = {}
    for key, default in _COMPARED.items():
        value = alarm.get(key)
        if value is None or value == []:
            value = default
        if key in ("AlarmActions", "OKActions", "InsufficientDataActions"):
            value = sorted(value)
        elif key == "Dimensions":
            value = _canonical_dims(value)
        elif key == "Metrics":
            value = [_canonical_query(q) for q in value]
        elif key == "Threshold" and value is not None:
            value = float(value)
        out[key] = value
    if out["DatapointsToAlarm"] is None:
        out["DatapointsToAlarm"] = out["EvaluationPeriods"]
    return out


def _difference(key: str, old: Any, new: Any) -> str:
    if key in ("Metrics", "Dimensions") or (isinstance(new, str) and len(new) > 40):
        return f"{key} changed"
    return f"{key} {old!r} -> {new!r}"


def differences(current: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    """One ``Field old -> new`` entry per compared field that differs."""
    a, b = canonical(current), canonical(desired)
    return [_difference(key, a[key], b[key]) for key in _COMPARED if a[key] != b[key]]


def existing_alarms(cw: CloudWatch, opts: Options) -> dict[str, dict[str, Any]]:
    return {a["AlarmName"]: a for a in _pages(cw.describe_alarms, "MetricAlarms",
                                               AlarmNamePrefix=opts.alarm_prefix,
                                               AlarmTypes=["MetricAlarm"])}


def plan(cw: CloudWatch, opts: Options) -> tuple[list[Change], list[str]]:
    """What ``apply`` would do, one :class:`Change` per alarm, and notes."""
    nodes = discover(cw, opts)
    missing = [n for n in opts.nodes if n not in nodes]
    if missing:
        raise UsageError(f"--node {missing[0]}: no recent GPU metrics for it in cluster "
                         f"{opts.cluster!r}, namespace {opts.namespace!r}")
    desired, notes = desired_alarms(opts, nodes)
    if not nodes:
        notes.append(f"no node of cluster {opts.cluster!r} published GPU metrics to "
                     f"{opts.namespace!r} in the last 3 hours")
    current = existing_alarms(cw, opts)
    changes: list[Change] = []
    for alarm in desired:
        name = alarm["AlarmName"]
        if name not in current:
            changes.append(Change("create", name, alarm=alarm))
        else:
            diff = differences(current[name], alarm)
            changes.append(Change("update", name, "; ".join(diff), alarm) if diff
                           else Change("unchanged", name))
    wanted = {a["AlarmName"] for a in desired}
    for name in sorted(set(current) - wanted):
        node = name.removeprefix(opts.alarm_prefix).split("/")[0]
        # Only alarms of nodes the run looked at: with --node, others are not ours to judge.
        if opts.nodes and node not in opts.nodes:
            continue
        # A node that still publishes can lose an alarm (a GPU put in MIG mode, GPM gone):
        # say so, rather than send the operator looking for a node that stopped publishing.
        # Only an alarm this program made (tagged so at creation) is ever deleted: one an
        # operator made by hand under the same prefix is said and left alone.
        if not ours(cw, current[name]):
            changes.append(Change("foreign", name))
            continue
        detail = ("its node still publishes GPU metrics, but this alarm no longer applies "
                  "to it") if node in nodes else ""
        changes.append(Change("delete" if opts.prune else "stale", name, detail))
    return changes, notes


def ours(cw: CloudWatch, alarm: dict[str, Any]) -> bool:
    """Whether ``alarm`` carries the ``managed-by`` tag :func:`execute` gives the alarms it
    creates (``ListTagsForResource``; an alarm without an ARN is not ours)."""
    arn = alarm.get("AlarmArn")
    if not arn:
        return False
    tags = cw.list_tags_for_resource(ResourceARN=arn).get("Tags", [])
    return any(t.get("Key") == "managed-by" and t.get("Value") == PROG for t in tags)


_SYMBOL = {"create": "+", "update": "~", "delete": "-", "stale": "!", "foreign": "?",
           "unchanged": "="}


def _line(change: Change) -> str:
    if change.action == "stale":
        why = change.detail or "its node published no GPU metrics in 3 hours"
        return f"! stale   {change.name} ({why}; --prune deletes it)"
    if change.action == "foreign":
        return (f"? foreign {change.name} (not tagged managed-by={PROG}: not made by this "
                f"program, never deleted by it)")
    if change.action == "delete":
        return f"- delete  {change.name}"
    detail = f": {change.detail}" if change.detail else ""
    return f"{_SYMBOL[change.action]} {change.action:<7} {change.name}{detail}"


def execute(cw: CloudWatch, opts: Options, out: TextIO) -> int:
    changes, notes = plan(cw, opts)
    for note in notes:
        print(f"note: {note}", file=out)
    counts = {action: 0 for action in _SYMBOL}
    for change in changes:
        counts[change.action] += 1
        if change.action != "unchanged":
            print(_line(change), file=out)
        if opts.command != "apply":
            continue
        if change.action == "create" and change.alarm is not None:
            tags = [{"Key": "managed-by", "Value": PROG},
                    {"Key": "gpuscope:cluster", "Value": opts.cluster}]
            cw.put_metric_alarm(**change.alarm, Tags=tags)
        elif change.action == "update" and change.alarm is not None:
            cw.put_metric_alarm(**change.alarm)
    doomed = [c.name for c in changes if c.action == "delete"]
    if opts.command == "apply":
        for i in range(0, len(doomed), 100):
            cw.delete_alarms(AlarmNames=doomed[i:i + 100])
    changed = counts["create"] + counts["update"] + counts["delete"]
    if not changed:
        print(f"No changes: {counts['unchanged']} alarm(s) up to date.", file=out)
    else:
        verb = "Applied" if opts.command == "apply" else "Plan"
        print(f"{verb}: {counts['create']} to create, {counts['update']} to update, "
              f"{counts['delete']} to delete, {counts['unchanged']} unchanged.", file=out)
    return 0


# ---- command line --------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Create or update gpuscope's CloudWatch alarms.")
    p.add_argument("--version", action="version", version=f"{PROG} {version()}")
    p.add_argument("command", choices=("plan", "apply"),
                   help="plan: show what would change; apply: make the changes")
    p.add_argument("--cluster", required=True, help="cluster name (the ClusterName dimension)")
    p.add_argument("--region", help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION)")
    p.add_argument("--endpoint-url", help="CloudWatch endpoint (e.g. a local test server)")
    p.add_argument("--namespace", default="CWAgent", help="metric namespace (default CWAgent)")
    p.add_argument("--sns-topic-arn", help="SNS topic notified on ALARM and OK")
    p.add_argument("--node", action="append", default=[], dest="nodes", metavar="NAME",
                   help="only this node (repeatable; default: every node with GPU metrics)")
    p.add_argument("--idle-threshold", type=float, default=5.0, metavar="PERCENT",
                   help="a GPU below this utilization is idle (default 5)")
    p.add_argument("--idle-minutes", type=int, default=60,
                   help="how long every GPU of a node must be idle (default 60, a multiple of 5)")
    p.add_argument("--temperature", type=float, default=85.0, metavar="CELSIUS",
                   help="GPU temperature alarm threshold (default 85)")
    p.add_argument("--spin-minutes", type=int, default=30,
                   help="how long every GPU of a node must spin (default 30, a multiple of 5)")
    p.add_argument("--prune", action="store_true",
                   help="delete this cluster's alarms of nodes that no longer publish metrics")
    p.add_argument("--alarm-prefix", default="gpuscope", dest="prefix",
                   help="alarm names start with PREFIX/CLUSTER/ (default gpuscope)")
    return p


def parse_args(argv: Sequence[str] | None, env: dict[str, str] | None = None) -> Options:
    args = _parser().parse_args(argv)
    env = dict(os.environ) if env is None else env
    region = args.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not _CLUSTER.match(args.cluster):
        raise UsageError(f"--cluster: expected letters, digits, '-' and '_' (up to 100), "
                         f"got {args.cluster!r}")
    if not region:
        raise UsageError("no AWS region: pass --region or set AWS_REGION")
    if not re.match(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$", region):
        raise UsageError(f"--region: not an AWS region name: {region!r}")
    if args.endpoint_url:
        # Parsed as the exporter's --cloudwatch-endpoint-url is: a prefix check let a bad
        # port or IPv6 address through to botocore (a ValueError traceback) and a password
        # into the error line.
        try:
            endpoint_url(args.endpoint_url)
        except ValueError as exc:
            raise UsageError(f"--endpoint-url: {exc}") from None
    if args.sns_topic_arn and not _SNS_ARN.match(args.sns_topic_arn):
        raise UsageError(f"--sns-topic-arn: not an SNS topic ARN: {args.sns_topic_arn!r}")
    if not args.namespace or len(args.namespace) > 255 or args.namespace.startswith(":"):
        raise UsageError(f"--namespace: not a CloudWatch namespace: {args.namespace!r}")
    if not 0 < args.idle_threshold <= 100:
        raise UsageError(f"--idle-threshold: expected a percentage in (0, 100], "
                         f"got {args.idle_threshold:g}")
    if args.idle_minutes % 5 or not 5 <= args.idle_minutes <= 1440:
        raise UsageError(f"--idle-minutes: expected a multiple of 5 from 5 to 1440, "
                         f"got {args.idle_minutes}")
    if args.spin_minutes % 5 or not 5 <= args.spin_minutes <= 1440:
        raise UsageError(f"--spin-minutes: expected a multiple of 5 from 5 to 1440, "
                         f"got {args.spin_minutes}")
    if not 30 <= args.temperature <= 120:
        raise UsageError(f"--temperature: expected 30 to 120 °C, got {args.temperature:g}")
    if not _PREFIX.match(args.prefix):
        raise UsageError(f"--alarm-prefix: expected letters, digits, '.', '-' and '_', "
                         f"got {args.prefix!r}")
    for node in args.nodes:
        if not node or "/" in node:
            raise UsageError(f"--node: not a node name: {node!r}")
    return Options(command=args.command, cluster=args.cluster, region=region,
                   endpoint_url=args.endpoint_url, namespace=args.namespace,
                   sns_topic_arn=args.sns_topic_arn, nodes=tuple(args.nodes),
                   idle_threshold=args.idle_threshold, idle_minutes=args.idle_minutes,
                   temperature=args.temperature, spin_minutes=args.spin_minutes,
                   prune=args.prune, prefix=args.prefix)


def make_client(opts: Options) -> CloudWatch:
    # boto3 is imported here, so that --help and input errors work without it.
    boto3 = importlib.import_module("boto3")
    config = importlib.import_module("botocore.config")
    try:
        client = boto3.client(
            "cloudwatch", region_name=opts.region, endpoint_url=opts.endpoint_url,
            # Standard retries (3 attempts unless AWS_MAX_ATTEMPTS says otherwise).
            config=config.Config(retries={"mode": "standard"}, connect_timeout=5,
                                 read_timeout=30),
        )
    except ValueError as exc:
        # botocore reads the AWS_* environment here and raises ValueError for a value it
        # cannot convert (AWS_MAX_ATTEMPTS=abc): bad input, as the exporter reports it.
        raise UsageError(f"cannot create the CloudWatch client: {exc}") from None
    return cast(CloudWatch, client)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        opts = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        errors = importlib.import_module("botocore.exceptions")
        # boto3 too, here: botocore alone (the AWS CLI v1 brings it) passed this check, and
        # make_client's import of boto3 then ended in a traceback.
        importlib.import_module("boto3")
    except ImportError:
        print(f"{PROG}: error: boto3 is not installed (pip install boto3)", file=sys.stderr)
        return 1
    try:
        return execute(make_client(opts), opts, out)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except errors.ClientError as exc:
        err = exc.response.get("Error", {})
        message = " ".join(str(err.get("Message", exc)).split())
        print(f"{PROG}: error: AWS {err.get('Code', 'error')}: {message}", file=sys.stderr)
        return 1
    except errors.BotoCoreError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
