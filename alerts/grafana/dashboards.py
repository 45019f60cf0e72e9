"""The four gpuscope dashboards: fleet, node, workload, namespace/pod.

Every verdict a panel shows is a rule of ``alerts/gpuscope-rules.yaml`` taken by name
(:class:`~.rules.Rules`): the alert expressions without their ``for:`` (what holds now; a
state timeline shows for how long), and the recorded series the alerts are built on. What
is drawn but is not a verdict (a utilization curve, power, clocks) reads the exporter's
series directly, through ``rate()`` of its counters where it has them.

Each dashboard's expressions are written unscoped and narrowed at the end
(:func:`~.promql.scope`): every selector gets ``cluster=~"$cluster"`` (and, on the node
dashboard, ``node=~"$node"``), every ``by``/``on`` the ``cluster`` label.
:func:`with_cluster_label` then renames that label for a store that calls it otherwise, and
:func:`with_replica_labels` reads each series once where a store holds HA replicas' copies.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

from gpuscope.alerts.grafana.panels import (
    Json,
    Layout,
    Query,
    bargauge,
    dashboard,
    datasource_variable,
    heatmap,
    links_to,
    query_variable,
    stat,
    state_timeline,
    table,
    timeseries,
)
from gpuscope.alerts.grafana.promql import count_once, rename_label, scope
from gpuscope.alerts.grafana.rules import DEVICE_PRICE, NODE_PRICE, Rules, node_info

CLUSTER = {"cluster": '=~"$cluster"'}
NODE = {**CLUSTER, "node": '=~"$node"'}

#: Per node, the mean utilization of its whole GPUs over each minute: a recording rule of the
#: gpuscope dashboard's group (used where the rule file has it).
NODE_BUSY = "node:gpu_busy_ratio:avg1m"

#: Throttle reasons that slow a GPU down against its peers (GpuThrottled's).
SLOWING = 'reason=~"power|thermal|reliability|board_limit"'

# Ranks, containers: a readable series name.
# Queries named by a node (or an instance type) wrap it in in_cluster(), whose label the
# legend reads: "<cluster>/<node>" where the store has several clusters.
RANK = "{{namespace}}/{{pod}} · {{cluster_node}} GPU {{gpu}}"
CONTAINER = "{{namespace}}/{{pod}}/{{container}} · {{cluster_node}} GPU {{gpu}}"
# The node dashboard's devices (on_node(): "<cluster>/<node> " first where series have a
# cluster), a GPU by its index, a MIG slice by _profile_of's "6/1 3g.40gb".
NAMED = "{{named}}"
GPU = ("GPU $1", ("gpu",))
SLICE = ("GPU $1", ("device",))  # _profile_of's label: "0", or "6/1 3g.40gb"
# A node's number in a stat: one per node of the chosen clusters, named where there are
# several ("auto" text mode shows a name only then).
PER_NODE = "{{cluster_node}}"

# The store's cluster label, from a series only the store labels: `gpu_node_info` may carry
# the exporters' own `cluster` (`--cluster-name`) in a cluster's own Prometheus, where no
# other series has it, and picking that value would narrow every other series away.
CLUSTER_DESCRIPTION = ("The `{label}` label of a multi-cluster store (Thanos, Mimir, "
                       "federation); All where there is none.")
CLUSTER_VARIABLE = query_variable(
    "cluster", "Cluster", "label_values(gpu_info, cluster)",
    description=CLUSTER_DESCRIPTION.format(label="cluster"))


DEVICE_STATES = [(0, "working", "green"), (1, "idle", "red"), (2, "spinning", "orange")]

# Raw series are read by their identity (``max by`` the labels that name a device or a
# container, and a counter's rate per device before any sum over devices or reasons): an HA
# pair's two copies of a series in a store that keeps both (docs/alerts.md, "HA pairs")
# count once, as in the rules.
WHOLE_GPUS = 'max by (node, uuid) (gpu_info{parent_uuid=""})'


def in_cluster(expr: str, label: str = "node") -> str:
    """``expr`` with a label ``cluster_<label>`` for legends: ``<cluster>/<value of label>``
    on a store of several clusters, the value alone where the series have no cluster. Two
    clusters' namesake nodes (EKS names nodes after their private IP) are then two names,
    and a cluster's own Prometheus shows no cluster (a legend cannot leave out a label a
    series lacks: Grafana writes the label's name in its place)."""
    name = f"cluster_{label}"
    return (f'label_replace(\nlabel_join(\n{expr},\n"{name}", "/", "cluster", "{label}"),\n'
            f'"{name}", "$1", "{name}", "/(.*)")')


def on_node(expr: str, name: str, parts: tuple[str, ...] = ()) -> str:
    """``expr`` (by node) with a label ``named`` for the node dashboard's legends: ``name``
    (a ``label_replace`` replacement whose ``$1``, ``$2``... are the values of ``parts``)
    where the series have no cluster, ``<cluster>/<node> `` and ``name`` where they have
    one. The node dashboard shows every node of the chosen clusters by the chosen name, so
    with several clusters chosen two clusters' namesake nodes are both on it, and their
    devices are named apart, as :func:`in_cluster` names nodes on the other dashboards.
    (Values are joined with ``;``, which no node name, index or profile holds.)"""
    fields = "".join(";([^;]*)" for _ in parts)
    shifted = re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + 2}", name)
    joined = "".join(f', "{p}"' for p in parts)
    return (f'label_replace(\nlabel_replace(\nlabel_join(\n{expr},\n'
            f'"named", ";", "cluster", "node"{joined}),\n'
            f'"named", "$1/$2 {shifted}", "named", "([^;]+);([^;]*){fields}"),\n'
            f'"named", "{name}", "named", ";[^;]*{fields}")')


def containers(expr: str) -> str:
    """The number of containers among the rows of ``expr`` (one row per container and
    device: a container holding two GPUs is two rows and one container)."""
    return f"count(\ncount by (node, namespace, pod, container) (\n{expr}\n)\n)"


def per_container(metric: str, matchers: str = "") -> str:
    """``metric`` (a ``container_gpu_*`` series) once per container and device."""
    selector = ", ".join(m for m in (matchers, 'pod!=""') if m)
    return f"max by (node, namespace, pod, container, uuid) ({metric}{{{selector}}})"


def _scoped(layout: Layout, matchers: dict[str, str]) -> Layout:
    """Narrows every query of ``layout`` to the dashboard's variables."""
    for panel in layout.panels:
        for target in panel.get("targets", []):
            target["expr"] = scope(target["expr"], matchers, ("cluster",))
    return layout


def _gpu_of(expr: str, labels: str = "gpu") -> str:
    """``expr`` (by node and uuid) with the GPU index label of ``gpu_info`` joined in."""
    return (f"(\n{expr}\n)\n* on (node, uuid) group_left ({labels})\n"
            f"max by (node, uuid, {labels}) (gpu_info)")


def _profile_of(expr: str) -> str:
    """``expr`` (by node, gpu and uuid) with the MIG profile of each device joined in
    (none for a whole GPU), and a ``device`` label to name it by: its index, then its
    profile where it has one (``0``, ``6/1 3g.40gb``). A legend cannot leave out a label a
    series lacks (Grafana writes the label's name in its place), so the name is made here."""
    joined = (f"(\n{expr}\n)\n* on (node, uuid) group_left (mig_profile)\n"
              "max by (node, uuid, mig_profile) (gpu_info)")
    return (f'label_replace(\nlabel_join(\n{joined},\n"device", " ", "gpu", "mig_profile"),\n'
            '"device", "$1", "device", "(.*) ")')


def fleet(rules: Rules) -> Json:
    idle_nodes = rules.expr("GpuNodeUnderutilized")
    spinning = rules.series("uuid:gpu_spinning_utilization:ratio")
    idle_dollars = f"sum(\n{NODE_PRICE}\nand on (node)\n(\n{idle_nodes}\n)\n)"
    spinning_dollars = (f"sum(\nmax by (node, uuid) ({spinning}) * 0\n"
                        f"+ on (node) group_left ()\n{DEVICE_PRICE}\n)")
    # Stacked on the idle nodes: the spinning GPUs of the other nodes only (an idle node's
    # spinning GPUs are in its price already); $0 while there is none.
    spinning_at_work_dollars = (
        f"sum(\n(\nmax by (node, uuid) ({spinning}) * 0\n"
        f"unless on (node)\n(\n{idle_nodes}\n)\n)\n+ on (node) group_left ()\n"
        f"{DEVICE_PRICE}\n)\nor vector(0)")
    if rules.has(NODE_BUSY):
        # The dashboard group's per-node minute means (one series per node, server-side):
        # at thousands of nodes the panel reads one series per row instead of every GPU's.
        heat = f"avg_over_time({NODE_BUSY}[$__rate_interval])"
        heat_source = f"`{NODE_BUSY}`, the minute means of the dashboard's recording rules"
    else:
        # Whole GPUs by their 5-minute busy means; MIG slices (which have none) by what the
        # idle rule reads of them, so a node of MIG GPUs has its row too.
        heat = (f"avg by (node) (\n{rules.series('uuid:gpu_busy_ratio:rate5m')}\n"
                f"or on (node, uuid)\n{rules.series('uuid:gpu_activity:ratio')}\n)")
        heat_source = ("5-minute means, `uuid:gpu_busy_ratio:rate5m`; MIG slices by "
                       "`uuid:gpu_activity:ratio`")
    lay = Layout()
    lay.row("Now: what idle GPUs cost")
    lay.add(stat("Idle nodes: $/hour", (
        "What the nodes whose every GPU is idle cost per hour, at the on-demand price of "
        "their instance type (rule GpuNodeUnderutilized without its 1h `for`; prices: the "
        f"`{NODE_PRICE}` recording rules). Idle nodes of an unpriced type are not counted."),
        Query(idle_dollars, instant=True), unit="currencyUSD", decimals=2, color="red"), 4, 4)
    lay.add(stat("Idle nodes", "Nodes whose every GPU (and MIG slice) is idle or spinning "
                  "(GpuNodeUnderutilized without its `for`).",
                  Query(f"count(\n{idle_nodes}\n)", instant=True), color="red"), 4, 4)
    lay.add(stat("Spinning GPUs: $/hour", (
        "GPUs busy by utilization but doing no work (a hung collective, a busy-wait), at "
        "their share of their node's price."),
        Query(spinning_dollars, instant=True), unit="currencyUSD", decimals=2,
        color="orange"), 4, 4)
    lay.add(stat("Spinning GPUs", f"GPUs with `{spinning}` (GpuSpinning without its `for`).",
                 Query(f"count({spinning})", instant=True), color="orange"), 4, 4)
    lay.add(stat("Allocated-idle containers", (
        "Containers that hold a GPU or MIG slice and use less than 5 % of it "
        "(GpuAllocatedButIdle without its `for`); one that holds two such devices counts "
        "once."),
        Query(containers(rules.expr("GpuAllocatedButIdle")), instant=True),
        color="orange"), 4, 4)
    lay.add(stat("GPUs", "Physical GPUs reporting (MIG slices not counted).",
                 Query(f"count({WHOLE_GPUS})", instant=True), color="blue"), 4, 4)

    lay.row("Over time")
    lay.add(timeseries("Idle $/hour", (
        "What idle capacity costs per hour over time (the same rules as above), stacked: "
        "the idle nodes, and the spinning GPUs of the nodes that are not idle (those of an "
        "idle node are in its price)."),
        [Query(idle_dollars, "idle nodes"),
         Query(spinning_at_work_dollars, "spinning GPUs on other nodes")],
        unit="currencyUSD", min_value=0, stack=True), 8, 8)
    lay.add(heatmap("GPU utilization by node", (
        f"Mean utilization of each node's whole GPUs ({heat_source}): a row per node, red "
        "is idle."), Query(in_cluster(heat), "{{cluster_node}}")), 16, 8)
    lay.add(state_timeline("Idle and spinning nodes", (
        "Nodes while they are idle (every device idle) or have a spinning GPU; nodes at "
        "work are left out, so the panel stays readable on a large fleet."),
        Query(in_cluster(f"(\n{idle_nodes}\n) * 0 + 1\nor on (node)\n"
                         f"(max by (node) ({spinning}) * 0 + 2)"), "{{cluster_node}}"),
        DEVICE_STATES), 24, 8)

    lay.row("Lists")
    lay.add(table("Idle nodes", "Idle nodes, their instance type and on-demand price.", [
        Query(f"(\n{idle_nodes}\n)\n* on (node) group_left (instance_type, capacity_type)\n"
              f"{node_info('instance_type, capacity_type')}", instant=True),
        Query(f"{NODE_PRICE}\nand on (node)\n(\n{idle_nodes}\n)", instant=True),
    ], {"Value #A": "busiest device utilization", "Value #B": "$/hour (on demand)"},
        hide=["provider", "region", "price_date"],
        units={"busiest device utilization": "percentunit",
               "$/hour (on demand)": "currencyUSD"}, sort_by="$/hour (on demand)"), 12, 8)
    lay.add(table("Spinning GPUs", (
        "GPUs busy doing no work, with the pod that holds them (GpuSpinning) and their "
        "share of the node's price."), [
        Query(rules.expr("GpuSpinning"), instant=True),
        Query(f"max by (node, uuid) ({spinning}) * 0\n+ on (node) group_left ()\n"
              f"{DEVICE_PRICE}", instant=True),
    ], {"Value #A": "utilization", "Value #B": "$/hour"},
        units={"utilization": "percentunit", "$/hour": "currencyUSD"}), 12, 8)
    lay.add(table("Allocated-idle containers", (
        "Containers that hold a GPU or MIG slice and use less than 5 % of it: SM activity "
        "where GPM gives it, else utilization, else (a MIG slice) whether a process runs."),
        [Query(rules.expr("GpuAllocatedButIdle"), instant=True)],
        {"Value": "usage of what it holds"}, units={"usage of what it holds": "percentunit"}),
        12, 8)
    lay.add(table("Throttled GPUs", "Clocks held down by power, thermal, reliability or "
                  "board limits at least 20 % of the time (GpuThrottled).",
                  [Query(rules.expr("GpuThrottled"), instant=True)],
                  {"Value": "share of time throttled"},
                  units={"share of time throttled": "percentunit"}), 12, 8)
    lay.add(table("Starved on shared GPUs", (
        "Containers on a time-sliced GPU that is at least 90 % busy and that get less than "
        "half their fair share (GpuTimeSliceStarvation)."),
        [Query(rules.expr("GpuTimeSliceStarvation"), instant=True)],
        {"Value": "fraction of fair share"}, units={"fraction of fair share": "percentunit"}),
        12, 8)
    lay.add(bargauge("Idle devices by instance type", (
        "Idle GPUs and MIG slices (`uuid:gpu_idle:bool`) per instance type: where the fleet "
        "has room."),
        Query(in_cluster(f"sum by (instance_type) (\n{rules.series('uuid:gpu_idle:bool')}\n"
                         "* on (node) group_left (instance_type)\n"
                         f"{node_info('instance_type')}\n)", "instance_type"),
              "{{cluster_instance_type}}", instant=True), unit="none", max_value=None,
        steps={"mode": "absolute", "steps": [{"value": None, "color": "orange"}]}), 12, 8)
    return dashboard(
        "gpuscope-fleet", "gpuscope / Fleet",
        "Idle GPU nodes and what they cost, spinning GPUs, allocated-idle containers, "
        "throttled and starved GPUs, from the gpuscope rules.",
        _scoped(lay, CLUSTER), [datasource_variable(), CLUSTER_VARIABLE], links=links_to())


def node(rules: Rules) -> Json:
    idle = rules.series("uuid:gpu_idle:bool")
    spinning = rules.series("uuid:gpu_spinning_utilization:ratio")
    lay = Layout()
    lay.row("The node")
    lay.add(stat("Instance type", "From `gpu_node_info` (node labels, or the exporter's "
                 "`--instance-type`).",
                 # Empty labels named here: a legend writes a missing label's name.
                 Query(on_node('label_replace(label_replace(\n'
                               f"{node_info('instance_type, capacity_type')},\n"
                               '"instance_type", "unknown", "instance_type", ""),\n'
                               '"capacity_type", "capacity type unknown", "capacity_type", "")',
                               "$1 ($2)", ("instance_type", "capacity_type")),
                       NAMED, instant=True),
                 text_mode="name", color="blue"), 6, 4)
    lay.add(stat("$/hour (on demand)", f"`{NODE_PRICE}`; \"unknown\" when the price table "
                 "has no price for the instance type.",
                 Query(in_cluster(f"sum by (node) ({NODE_PRICE})"), PER_NODE, instant=True),
                 unit="currencyUSD", no_value="unknown", decimals=2, text_mode="auto"), 4, 4)
    lay.add(stat("GPUs", "Physical GPUs.",
                 Query(in_cluster(f"count by (node) ({WHOLE_GPUS})"), PER_NODE, instant=True),
                 color="blue", text_mode="auto"), 3, 4)
    lay.add(stat("MIG slices", "MIG devices (each its own device, with its parent GPU).",
                 Query(in_cluster('count by (node) (max by (node, uuid) '
                                  '(gpu_info{parent_uuid!=""}))'), PER_NODE, instant=True),
                 color="blue", text_mode="auto"), 3, 4)
    lay.add(stat("Idle devices", "Idle or spinning GPUs and MIG slices "
                 "(`node:gpu_idle_devices:count`).",
                 Query(in_cluster(f"sum by (node) ({rules.series('node:gpu_idle_devices:count')})"),
                       PER_NODE, instant=True), color="red", text_mode="auto"), 4, 4)
    lay.add(stat("Spinning GPUs", "Busy by utilization, doing no work.",
                 Query(in_cluster(f"count by (node) ({spinning})"), PER_NODE, instant=True),
                 color="orange", text_mode="auto"), 4, 4)

    lay.row("Devices: GPUs and MIG slices")
    lay.add(table("Devices", (
        "Every GPU and MIG slice. A slice is a device of its own: its index is "
        "`<parent>/<gpu instance>`, its parent's UUID is in `parent_uuid`. Idle: 1 idle "
        "(or spinning), 0 working; empty where the activity is unknown (a GPU in MIG "
        "mode: see its slices)."), [
        Query("max by (node, gpu, uuid, model, mig_profile, parent_uuid) (gpu_info)",
              instant=True),
        Query(f"max by (node, gpu, uuid) ({idle})", instant=True),
        Query(f"max by (node, gpu, uuid) ({rules.series('uuid:gpu_activity:ratio')})",
              instant=True),
        Query("max by (node, gpu, uuid) (gpu_memory_used_bytes)", instant=True),
    ], {"Value #A": "", "Value #B": "idle", "Value #C": "activity",
        "Value #D": "memory used"}, hide=["Value #A"],
        units={"activity": "percentunit", "memory used": "bytes"}), 24, 9)
    lay.add(state_timeline("Device verdicts", (
        "Each GPU and MIG slice: working, idle (below 5 %: utilization, else SM activity, "
        "else no process on a slice), or spinning (busy doing no work)."),
        Query(on_node(f"max by (node, gpu, uuid) ({idle})\n"
                      "+ on (node, uuid) group_left ()\n"
                      f"(max by (node, uuid) ({spinning}) * 0 + 1)\n"
                      f"or on (node, uuid)\nmax by (node, gpu, uuid) ({idle})", *GPU), NAMED),
        DEVICE_STATES), 24, 8)
    lay.add(table("Who holds each device", "Containers holding a GPU or a MIG slice, and how "
                  "much of it they use (`container:gpu_held_usage:ratio`).",
                  [Query(_gpu_of(rules.series("container:gpu_held_usage:ratio")),
                         instant=True)],
                  {"Value": "usage of what it holds"},
                  units={"usage of what it holds": "percentunit"}), 24, 7)

    lay.row("Signals")
    lay.add(timeseries("Utilization", "Share of time a kernel ran, from the busy-time "
                       "counter (whole GPUs; a GPU in MIG mode has none).",
                       [Query(on_node("max by (node, gpu, uuid) "
                              "(rate(gpu_busy_seconds_total[$__rate_interval]))", *GPU), NAMED)],
                       unit="percentunit", min_value=0, max_value=1), 12, 8)
    for title, counter in (("SM activity", "gpu_sm_active_seconds_total"),
                           ("Tensor activity", "gpu_tensor_active_seconds_total"),
                           ("DRAM activity", "gpu_dram_active_seconds_total")):
        lay.add(timeseries(f"{title} (GPM)", (
            f"From `{counter}`: per GPU and per MIG instance (every slice of one GPU "
            "instance reads the same), Hopper and newer; absent elsewhere."),
            [Query(on_node(_profile_of(f"max by (node, gpu, uuid) (rate({counter}"
                                       "[$__rate_interval]))"), *SLICE), NAMED)],
            unit="percentunit", min_value=0, max_value=1), 12, 8)
    lay.add(timeseries("Memory used", "GPU memory in use, per GPU and MIG slice.",
                       [Query(on_node(_profile_of("max by (node, gpu, uuid) "
                                                  "(gpu_memory_used_bytes)"), *SLICE), NAMED)],
                       unit="bytes", min_value=0), 12, 8)
    lay.add(timeseries("Power", "Power from the energy counter.",
                       [Query(on_node("max by (node, gpu, uuid) "
                              "(rate(gpu_energy_joules_total[$__rate_interval]))", *GPU), NAMED)],
                       unit="watt", min_value=0), 12, 8)
    lay.add(timeseries("Temperature", "", [Query(on_node(
        "max by (node, gpu, uuid) (gpu_temperature_celsius)", *GPU), NAMED)], unit="celsius"),
        12, 8)
    lay.add(timeseries("SM clock", "", [Query(on_node(
        "max by (node, gpu, uuid) (gpu_sm_clock_hertz)", *GPU), NAMED)], unit="hertz"), 12, 8)
    lay.add(timeseries("Throttled time by reason", "Share of the node's GPU time with "
                       "clocks held down, by reason: the mean over its GPUs (100 % is every "
                       "GPU held down all the time).",
                       [Query(on_node("avg by (node, reason) (max by (node, gpu, uuid, reason) "
                                      "(rate(gpu_throttle_seconds_total[$__rate_interval])))",
                                      "$1", ("reason",)), NAMED)],
                       unit="percentunit", min_value=0), 12, 8)
    lay.add(timeseries("PCIe and NVLink", "Bytes per second, summed over the node's GPUs.", [
        Query(on_node(f"sum by (node) (max by (node, gpu, uuid) (rate({name}[$__rate_interval])))",
                      label), NAMED)
        for name, label in (("gpu_pcie_receive_bytes_total", "PCIe receive"),
                            ("gpu_pcie_transmit_bytes_total", "PCIe transmit"),
                            ("gpu_nvlink_receive_bytes_total", "NVLink receive"),
                            ("gpu_nvlink_transmit_bytes_total", "NVLink transmit"))],
        unit="Bps", min_value=0), 12, 8)
    node_variable = query_variable(
        "node", "Node", 'label_values(gpu_info{cluster=~"$cluster"}, node)',
        multi=False, include_all=False)
    return dashboard(
        "gpuscope-node", "gpuscope / Node",
        "One GPU node: its devices (MIG slices as devices of their own), their verdicts, "
        "who holds them, and their signals.",
        _scoped(lay, NODE), [datasource_variable(), CLUSTER_VARIABLE, node_variable],
        time_from="now-3h", links=links_to())


def workload(rules: Rules) -> Json:
    holders = (f"{rules.series('uuid:gpu_holder:info')}"
               '{namespace=~"$namespace", workload=~"$workload"}')

    def per_rank(signal: str) -> str:
        """``signal`` (by node, gpu and uuid) beside each rank holding the device."""
        return f"{holders}\n* on (node, uuid) group_left (gpu)\n{signal}"

    busy_range = "max by (node, gpu, uuid) (rate(gpu_busy_seconds_total[$__range]))"
    lay = Layout()
    lay.row("Every rank over the time range")
    lay.add(bargauge("Utilization per rank", (
        "Mean utilization over the whole time range, from the busy-time counter. A rank "
        "far below its peers is stalled (it waits while they work)."),
        Query(in_cluster(per_rank(busy_range)), RANK, instant=True)), 8, 10)
    lay.add(bargauge("Utilization against the median", (
        "Each rank's mean utilization over the time range divided by the median of the "
        "selected ranks: below 0.5 is a stalled straggler."),
        # The median per cluster (a job runs in one): the join is made on the cluster label
        # (the scoping adds it to `on`), which a median over all clusters would not carry.
        Query(in_cluster(f"{per_rank(busy_range)}\n/ on () group_left ()\n"
                         f"quantile by (cluster) (0.5, {per_rank(busy_range)})"),
              RANK, instant=True),
        unit="none", max_value=2,
        steps={"mode": "absolute", "steps": [{"value": None, "color": "red"},
                                             {"value": 0.5, "color": "green"},
                                             {"value": 1.3, "color": "orange"}]}), 8, 10)
    lay.add(bargauge("SM activity per rank (GPM)", (
        "Mean SM activity over the time range. Among ranks that all read busy, one whose "
        "SM activity is well above the rest is the slow rank its peers spin waiting for."),
        Query(in_cluster(per_rank("max by (node, gpu, uuid) "
                                  "(rate(gpu_sm_active_seconds_total[$__range]))")),
              RANK, instant=True)),
        8, 10)

    lay.row("Every rank over time")
    for title, signal, unit in (
        ("Utilization", "max by (node, gpu, uuid) "
                        "(rate(gpu_busy_seconds_total[$__rate_interval]))", "percentunit"),
        ("SM activity (GPM)", "max by (node, gpu, uuid) "
                              "(rate(gpu_sm_active_seconds_total[$__rate_interval]))",
         "percentunit"),
        ("Power", "max by (node, gpu, uuid) (rate(gpu_energy_joules_total[$__rate_interval]))",
         "watt"),
        ("SM clock", "max by (node, gpu, uuid) (gpu_sm_clock_hertz)", "hertz"),
        ("Temperature", "max by (node, gpu, uuid) (gpu_temperature_celsius)", "celsius"),
        ("Throttled (power, thermal, reliability, board limit)",
         f"sum by (node, gpu, uuid) (max by (node, gpu, uuid, reason) "
         f"(rate(gpu_throttle_seconds_total{{{SLOWING}}}[$__rate_interval])))", "percentunit"),
    ):
        lay.add(timeseries(title, "One series per rank (a pod's GPU).",
                           [Query(in_cluster(per_rank(signal)), RANK)], unit=unit), 12, 8)
    namespace_variable = query_variable(
        "namespace", "Namespace",
        'label_values(gpu_pod_info{cluster=~"$cluster", workload!=""}, namespace)')
    workload_variable = query_variable(
        "workload", "Workload",
        'label_values(gpu_pod_info{cluster=~"$cluster", namespace=~"$namespace"}, workload)',
        multi=False, include_all=False,
        description="`<Kind>/<name>` of the pods' top owner, e.g. PyTorchJob/ddp-run.")
    return dashboard(
        "gpuscope-workload", "gpuscope / Workload",
        "Every rank (GPU) of a distributed job side by side: stalled and slow ranks, and "
        "why (throttling, clocks, temperature).",
        _scoped(lay, CLUSTER),
        [datasource_variable(), CLUSTER_VARIABLE, namespace_variable, workload_variable],
        time_from="now-3h", links=links_to())


def pods(rules: Rules) -> Json:
    pod_filter = 'namespace=~"$namespace", pod=~"$pod"'
    pods_selected = f"group by (node, namespace, pod) (gpu_pod_info{{{pod_filter}}})"

    def of_pods(expr: str) -> str:
        return f"(\n{expr}\n)\nand on (node, namespace, pod)\n{pods_selected}"

    allocated_idle = of_pods(rules.expr("GpuAllocatedButIdle"))
    held = of_pods(rules.series("container:gpu_held_usage:ratio"))
    lay = Layout()
    lay.row("Now")
    lay.add(stat("GPUs and slices held", "Devices (GPUs, MIG slices, time-slicing "
                 "replicas) held by the selected pods' containers.",
                 Query(f"count({per_container('container_gpu_allocated', pod_filter)} == 1)",
                       instant=True), color="blue"), 6, 4)
    lay.add(stat("Allocated-idle containers", "Holding a GPU or slice and using less than "
                 "5 % of it (GpuAllocatedButIdle without its `for`); one that holds two "
                 "such devices counts once.",
                 Query(containers(allocated_idle), instant=True), color="orange"), 6, 4)
    lay.add(stat("Allocated-idle: $/hour", (
        "Whole GPUs held and unused, at their share of the node's on-demand price (MIG "
        "slices and time-slicing replicas are not priced here)."),
        Query(f"sum(\n(\n({allocated_idle}) * 0\n"
              'and on (node, uuid) gpu_info{parent_uuid=""}\n'
              f"unless on (node, uuid) ({rules.series('uuid:container_gpu_sharing:count')}"
              f" > 1)\n)\n+ on (node) group_left ()\n{DEVICE_PRICE}\n)", instant=True),
        unit="currencyUSD", decimals=2, color="orange"), 6, 4)
    lay.add(stat("Starved containers", "On a shared GPU, below half their fair share "
                 "(GpuTimeSliceStarvation without its `for`).",
                 Query(f"count(\n{of_pods(rules.expr('GpuTimeSliceStarvation'))}\n)",
                       instant=True), color="red"), 6, 4)

    lay.row("Containers")
    lay.add(table("Containers and what they hold", (
        "Each container's device (GPU, MIG slice, or a time-slicing replica), how much of "
        "it the container uses, its memory, and its pod's workload."), [
        Query(_gpu_of(held, "gpu, model"), instant=True),
        Query(of_pods(per_container("container_gpu_memory_used_bytes")), instant=True),
        Query(f"max by (node, namespace, pod, workload) (gpu_pod_info{{{pod_filter}}})",
              instant=True),
    ], {"Value #A": "usage of what it holds", "Value #B": "memory used"},
        hide=["Value #C"],
        units={"usage of what it holds": "percentunit", "memory used": "bytes"}), 24, 9)
    lay.add(timeseries("GPU utilization per container", "A container's share of its "
                       "device's time (per process, summed).",
                       [Query(in_cluster(_gpu_of(of_pods(per_container(
                           "container_gpu_utilization_ratio")))), CONTAINER)],
                       unit="percentunit", min_value=0), 12, 8)
    lay.add(timeseries("Usage of what it holds", (
        "`container:gpu_held_usage:ratio`: the device's SM activity where GPM gives it and "
        "the container holds it alone; else its utilization times the holders; on a MIG "
        "slice without GPM, 1 while a process runs there."),
        [Query(in_cluster(_gpu_of(held)), CONTAINER)], unit="percentunit", min_value=0),
        12, 8)
    lay.add(timeseries("GPU memory used per container", "",
                       [Query(in_cluster(_gpu_of(of_pods(
                           per_container("container_gpu_memory_used_bytes")))), CONTAINER)],
                       unit="bytes", min_value=0), 12, 8)
    lay.add(timeseries("Share of a shared GPU (1 = fair)", (
        "On a shared GPU: the container's share of the summed utilization, against the fair "
        "share: 1/n of the n containers using it when time-sliced, 1/replicas (the client's "
        "active-thread share) under CUDA MPS (`container:gpu_fair_share_fraction:ratio`)."),
        [Query(in_cluster(_gpu_of(of_pods(
            rules.series("container:gpu_fair_share_fraction:ratio")))), CONTAINER)],
        unit="none", min_value=0), 12, 8)
    namespace_variable = query_variable(
        "namespace", "Namespace", 'label_values(gpu_pod_info{cluster=~"$cluster"}, namespace)')
    pod_variable = query_variable(
        "pod", "Pod",
        'label_values(gpu_pod_info{cluster=~"$cluster", namespace=~"$namespace"}, pod)')
    return dashboard(
        "gpuscope-pods", "gpuscope / Namespace and pod",
        "The GPUs a namespace's pods hold, how much of them they use, what the unused ones "
        "cost, and starvation on shared GPUs.",
        _scoped(lay, CLUSTER),
        [datasource_variable(), CLUSTER_VARIABLE, namespace_variable, pod_variable],
        time_from="now-3h", links=links_to())


def with_cluster_label(board: Json, label: str) -> Json:
    """``board`` (as a builder made it, reading the label ``cluster``) with every panel
    query and every variable query reading the label ``label`` instead (a store whose
    cluster label is called otherwise, with the rules rendered by ``python -m
    gpuscope.alerts.render --cluster-label``). The variable keeps its name, ``cluster``:
    the matchers' ``"$cluster"``, the drill-down links' ``${cluster:queryparam}`` and the
    dashboards' drop-down (which passes variables by name) stay as they are, so a link
    between two dashboards generated for one label keeps the clusters chosen."""
    out: Json = copy.deepcopy(board)
    for panel in out["panels"]:
        for inner in (panel, *panel.get("panels", [])):
            for target in inner.get("targets", []):
                target["expr"] = rename_label(target["expr"], "cluster", label)
    for variable in out["templating"]["list"]:
        if variable["type"] != "query":
            continue
        for key in ("query", "definition"):
            variable[key] = rename_label(variable[key], "cluster", label)
        if variable["name"] == "cluster":
            variable["description"] = CLUSTER_DESCRIPTION.format(label=label)
    return out


def with_replica_labels(board: Json, labels: tuple[str, ...]) -> Json:
    """``board`` with every panel query reading each series once where the store holds a
    copy of it per HA replica, told apart by ``labels`` (:func:`~.promql.count_once`: each
    selector, and each function of a range selector, under ``max without (<labels>)``), the
    recorded series as well as the raw ones: an HA pair that evaluates the rules in both
    replicas writes two copies of each recorded series. The variables' ``label_values`` list
    each value once already."""
    out: Json = copy.deepcopy(board)
    for panel in out["panels"]:
        for inner in (panel, *panel.get("panels", [])):
            for target in inner.get("targets", []):
                target["expr"] = count_once(target["expr"], labels)
    return out


#: File name (without ``.json``) -> builder.
DASHBOARDS: dict[str, Callable[[Rules], Json]] = {
    "gpuscope-fleet": fleet,
    "gpuscope-node": node,
    "gpuscope-workload": workload,
    "gpuscope-pods": pods,
}
