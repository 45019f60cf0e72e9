"""``gpuscope-alarms`` against a real moto server over HTTP.

The metrics are published the way gpuscope's CloudWatch sink publishes them (DESIGN.md's
CloudWatch contract: CWAgent, ``nvidia_smi_*`` with host/index/name/arch plus ClusterName and
InstanceType, ``node_gpu_utilization`` with ClusterName/NodeName/InstanceType); the command
runs as a subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import boto3
import pytest

from gpuscope.alerts.alarms import Options, canonical, desired_alarms, discover
from tests.alerts.conftest import REPO

REGION = "us-east-1"
TOPIC = "arn:aws:sns:us-east-1:123456789012:gpu-alarms"
NODE_A = "ip-10-0-1-17.ec2.internal"  # 4 GPUs
NODE_B = "ip-10-0-2-9.ec2.internal"   # 1 GPU

ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def client(url: str) -> Any:
    return boto3.client("cloudwatch", region_name=REGION, endpoint_url=url,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def publish(url: str, cluster: str, node: str, gpus: int, *, rollup: bool = True,
            mig_slices: tuple[str, ...] = (), instance_type: str = "g5.12xlarge",
            gpm: bool = False, instance_id: str | None = None,
            agent_only: bool = False) -> None:
    """One sampling minute of a node, as the sink publishes it with ``--cluster-name`` and
    its default device dimensions ("both": the agent's set and the extended one).
    ``mig_slices`` ("<gpu>/<instance>") are slices without utilization (no GPM): they publish
    memory only, and their parent GPU no utilization. ``gpm``: the GPUs publish SM and
    tensor activity (Hopper and newer), and the node their rollups. A node rollup goes out
    under the node's set, the cluster's, and with ``instance_id`` (``--instance-id``)
    Container Insights' node set too; the extended device set then has ``InstanceId``.
    ``agent_only``: the device metrics under the agent's set only
    (``--cloudwatch-device-dimensions agent``: no ``ClusterName`` on them)."""
    parents = {s.split("/")[0] for s in mig_slices}
    data: list[dict[str, Any]] = []

    def dims(index: str, extended: bool) -> list[dict[str, str]]:
        out = [{"Name": "host", "Value": node}, {"Name": "index", "Value": index},
               {"Name": "name", "Value": "NVIDIA A100-SXM4-80GB"},
               {"Name": "arch", "Value": "Ampere"}]
        if extended:
            if instance_id:
                out.append({"Name": "InstanceId", "Value": instance_id})
            out += [{"Name": "InstanceType", "Value": instance_type},
                    {"Name": "ClusterName", "Value": cluster}]
        return out

    for index in [str(i) for i in range(gpus)] + list(mig_slices):
        for extended in (False,) if agent_only else (False, True):
            d = dims(index, extended)
            data.append({"MetricName": "nvidia_smi_memory_used", "Dimensions": d,
                         "Value": 512.0})
            if "/" in index:
                continue
            data.append({"MetricName": "nvidia_smi_temperature_gpu", "Dimensions": d,
                         "StatisticValues": {"SampleCount": 60, "Sum": 1920, "Minimum": 31,
                                             "Maximum": 33}})
            if index not in parents:
                data.append({"MetricName": "nvidia_smi_utilization_gpu", "Dimensions": d,
                             "Values": [0.0, 1.0], "Counts": [50, 10]})
            if gpm:
                for name in ("nvidia_gpm_sm_active", "nvidia_gpm_tensor_active"):
                    data.append({"MetricName": name, "Dimensions": d,
                                 "Values": [0.5], "Counts": [60]})
    node_sets = [[{"Name": "ClusterName", "Value": cluster}, {"Name": "NodeName", "Value": node},
                  {"Name": "InstanceType", "Value": instance_type}]]
    if instance_id:
        node_sets.append([{"Name": "ClusterName", "Value": cluster},
                          {"Name": "NodeName", "Value": node},
                          {"Name": "InstanceId", "Value": instance_id}])
    node_sets.append([{"Name": "ClusterName", "Value": cluster}])
    for node_dims in node_sets if rollup else []:
        data.append({"MetricName": "node_gpu_utilization", "Dimensions": node_dims,
                     "Values": [0.0, 1.0], "Counts": [50 * gpus, 10 * gpus]})
        if gpm:
            for name in ("node_gpu_sm_active", "node_gpu_tensor_active"):
                data.append({"MetricName": name, "Dimensions": node_dims, "Values": [0.5],
                             "Counts": [60 * gpus], "Unit": "Percent"})
    # Small batches: botocore gzips PutMetricData bodies of 10 KB and more, and moto's server
    # (5.2) answers those with a 500.
    cw = client(url)
    for i in range(0, len(data), 8):
        cw.put_metric_data(Namespace="CWAgent", MetricData=data[i:i + 8])


def alarms_cli(url: str, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.alarms",
         *args, "--region", REGION, "--endpoint-url", url],
        cwd=REPO, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=120,
    )


def ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    return result.stdout.splitlines()


def alarms(url: str) -> dict[str, dict[str, Any]]:
    found = client(url).describe_alarms(MaxRecords=100)["MetricAlarms"]
    return {a["AlarmName"]: a for a in found}


@pytest.fixture
def fleet(moto: str) -> str:
    publish(moto, "prod", NODE_A, 4)
    publish(moto, "prod", NODE_B, 1)
    publish(moto, "staging", "ip-10-9-0-1.ec2.internal", 2)  # another cluster: not ours
    return moto


def test_apply_creates_the_alarms_and_a_second_apply_changes_nothing(fleet: str) -> None:
    first = ok(alarms_cli(fleet, "apply", "--cluster", "prod", "--sns-topic-arn", TOPIC))
    names = [f"gpuscope/prod/{node}/{alarm}" for node in (NODE_A, NODE_B)
             for alarm in ("GpuNodeUnderutilized", "GpuTemperatureHigh")]
    assert first == [f"+ create  {n}" for n in names] + [
        "Applied: 4 to create, 0 to update, 0 to delete, 0 unchanged."]
    created = alarms(fleet)
    assert sorted(created) == names  # nothing for the staging cluster

    # Idle: the node rollup's Maximum, the busiest device (one value per device per datum).
    idle = created[names[0]]
    assert (idle["Namespace"], idle["MetricName"], idle["Statistic"], idle["Period"]) == (
        "CWAgent", "node_gpu_utilization", "Maximum", 300)
    assert {d["Name"]: d["Value"] for d in idle["Dimensions"]} == {
        "ClusterName": "prod", "NodeName": NODE_A, "InstanceType": "g5.12xlarge"}
    assert idle["ComparisonOperator"] == "LessThanThreshold"
    assert idle["Threshold"] == 5.0
    assert idle["EvaluationPeriods"] == idle["DatapointsToAlarm"] == 12  # 12 x 5 min = 1 h
    assert idle["TreatMissingData"] == "notBreaching"
    assert idle["AlarmActions"] == idle["OKActions"] == [TOPIC]
    # Heat: the hottest of the node's GPUs, one hidden query per GPU (the extended
    # dimension set: the agent-only twin carries no ClusterName).
    hot = created[names[1]]
    assert (hot["ComparisonOperator"], hot["Threshold"]) == ("GreaterThanThreshold", 85.0)
    assert hot["EvaluationPeriods"] == hot["DatapointsToAlarm"] == 2
    assert hot["AlarmActions"] == hot["OKActions"] == [TOPIC]
    queries = hot["Metrics"]
    assert [q["Id"] for q in queries] == ["gpu0", "gpu1", "gpu2", "gpu3", "busiest"]
    assert queries[-1]["Expression"] == "MAX(METRICS())" and queries[-1]["ReturnData"] is True
    for i, q in enumerate(queries[:-1]):
        assert q["ReturnData"] is False
        assert q["MetricStat"]["Stat"] == "Maximum" and q["MetricStat"]["Period"] == 300
        metric = q["MetricStat"]["Metric"]
        assert (metric["Namespace"], metric["MetricName"]) == ("CWAgent",
                                                               "nvidia_smi_temperature_gpu")
        assert {d["Name"]: d["Value"] for d in metric["Dimensions"]} == {
            "host": NODE_A, "index": str(i), "name": "NVIDIA A100-SXM4-80GB", "arch": "Ampere",
            "ClusterName": "prod", "InstanceType": "g5.12xlarge"}
    tags = client(fleet).list_tags_for_resource(ResourceARN=idle["AlarmArn"])["Tags"]
    assert {"Key": "managed-by", "Value": "gpuscope-alarms"} in tags

    stamps = {n: a["AlarmConfigurationUpdatedTimestamp"] for n, a in created.items()}
    again = ok(alarms_cli(fleet, "apply", "--cluster", "prod", "--sns-topic-arn", TOPIC))
    assert again == ["No changes: 4 alarm(s) up to date."]
    # Nothing was written: moto bumps this timestamp on every PutMetricAlarm.
    assert {n: a["AlarmConfigurationUpdatedTimestamp"] for n, a in alarms(fleet).items()} == stamps
    assert ok(alarms_cli(fleet, "plan", "--cluster", "prod", "--sns-topic-arn", TOPIC)) == [
        "No changes: 4 alarm(s) up to date."]


def test_plan_changes_nothing_and_apply_updates_only_what_differs(fleet: str) -> None:
    planned = ok(alarms_cli(fleet, "plan", "--cluster", "prod"))
    assert planned[-1] == "Plan: 4 to create, 0 to update, 0 to delete, 0 unchanged."
    assert alarms(fleet) == {}
    ok(alarms_cli(fleet, "apply", "--cluster", "prod"))
    before = alarms(fleet)
    assert all(a["AlarmActions"] == [] for a in before.values())

    # A new threshold and an SNS topic: every alarm gets the topic, only the idle ones the
    # threshold; the plan says so field by field.
    args = ("--cluster", "prod", "--idle-threshold", "10", "--sns-topic-arn", TOPIC)
    planned = ok(alarms_cli(fleet, "plan", *args))
    idle_a = f"gpuscope/prod/{NODE_A}/GpuNodeUnderutilized"
    assert (f"~ update  {idle_a}: AlarmDescription changed; AlarmActions [] -> ['{TOPIC}']; "
            f"OKActions [] -> ['{TOPIC}']; Threshold 5.0 -> 10.0") in planned
    assert planned[-1] == "Plan: 0 to create, 4 to update, 0 to delete, 0 unchanged."
    assert alarms(fleet) == before

    applied = ok(alarms_cli(fleet, "apply", *args))
    assert applied[-1] == "Applied: 0 to create, 4 to update, 0 to delete, 0 unchanged."
    after = alarms(fleet)
    assert after[idle_a]["Threshold"] == 10.0
    assert all(a["AlarmActions"] == a["OKActions"] == [TOPIC] for a in after.values())
    assert ok(alarms_cli(fleet, "apply", *args)) == ["No changes: 4 alarm(s) up to date."]


def test_new_node_is_added_and_a_gone_node_is_pruned_only_when_asked(fleet: str) -> None:
    ok(alarms_cli(fleet, "apply", "--cluster", "prod"))
    publish(fleet, "prod", "ip-10-0-3-3.ec2.internal", 2)
    # An alarm of a node that no longer publishes (made by this program: tagged so), one of
    # another cluster's, and one an operator made by hand under the prefix (no tag).
    cw = client(fleet)
    ours = [{"Key": "managed-by", "Value": "gpuscope-alarms"},
            {"Key": "gpuscope:cluster", "Value": "prod"}]
    hand = "gpuscope/prod/ip-10-0-7-7.ec2.internal/MyOwnAlarm"
    for name, tags in (("gpuscope/prod/ip-10-0-9-9.ec2.internal/GpuNodeUnderutilized", ours),
                       ("gpuscope/prod-eu/ip-10-8-0-1.ec2.internal/GpuNodeUnderutilized", ours),
                       (hand, [])):
        cw.put_metric_alarm(AlarmName=name, Namespace="CWAgent",
                            MetricName="node_gpu_utilization", Statistic="Maximum",
                            Period=300, EvaluationPeriods=12, Threshold=5,
                            ComparisonOperator="LessThanThreshold", Tags=tags)
    foreign = (f"? foreign {hand} (not tagged managed-by=gpuscope-alarms: not made by this "
               "program, never deleted by it)")
    lines = ok(alarms_cli(fleet, "apply", "--cluster", "prod"))
    assert lines == [
        "+ create  gpuscope/prod/ip-10-0-3-3.ec2.internal/GpuNodeUnderutilized",
        "+ create  gpuscope/prod/ip-10-0-3-3.ec2.internal/GpuTemperatureHigh",
        foreign,
        "! stale   gpuscope/prod/ip-10-0-9-9.ec2.internal/GpuNodeUnderutilized (its node "
        "published no GPU metrics in 3 hours; --prune deletes it)",
        "Applied: 2 to create, 0 to update, 0 to delete, 4 unchanged.",
    ]
    lines = ok(alarms_cli(fleet, "apply", "--cluster", "prod", "--prune"))
    assert lines == [foreign,
                     "- delete  gpuscope/prod/ip-10-0-9-9.ec2.internal/GpuNodeUnderutilized",
                     "Applied: 0 to create, 0 to update, 1 to delete, 6 unchanged."]
    remaining = alarms(fleet)
    assert "gpuscope/prod/ip-10-0-9-9.ec2.internal/GpuNodeUnderutilized" not in remaining
    assert "gpuscope/prod-eu/ip-10-8-0-1.ec2.internal/GpuNodeUnderutilized" in remaining
    assert hand in remaining
    assert ok(alarms_cli(fleet, "plan", "--cluster", "prod", "--prune")) == [
        foreign, "No changes: 6 alarm(s) up to date."]


def test_node_filter_and_per_gpu_metric_math_without_the_rollup(moto: str) -> None:
    # A node that publishes no node rollup: the busiest of its per-GPU series instead.
    publish(moto, "prod", NODE_A, 2, rollup=False)
    publish(moto, "prod", NODE_B, 1)
    lines = ok(alarms_cli(moto, "apply", "--cluster", "prod", "--node", NODE_A))
    assert lines == [f"+ create  gpuscope/prod/{NODE_A}/GpuNodeUnderutilized",
                     f"+ create  gpuscope/prod/{NODE_A}/GpuTemperatureHigh",
                     "Applied: 2 to create, 0 to update, 0 to delete, 0 unchanged."]
    idle = alarms(moto)[f"gpuscope/prod/{NODE_A}/GpuNodeUnderutilized"]
    assert "MetricName" not in idle or not idle["MetricName"]
    queries = idle["Metrics"]
    assert [q["Id"] for q in queries] == ["gpu0", "gpu1", "busiest"]
    assert {q["MetricStat"]["Metric"]["MetricName"] for q in queries[:-1]} == {
        "nvidia_smi_utilization_gpu"}
    assert queries[-1]["Expression"] == "MAX(METRICS())"
    assert ok(alarms_cli(moto, "apply", "--cluster", "prod", "--node", NODE_A)) == [
        "No changes: 2 alarm(s) up to date."]


def test_mig_node_gets_no_idle_alarm(moto: str) -> None:
    publish(moto, "prod", NODE_A, 2, mig_slices=("1/1", "1/2"))
    lines = ok(alarms_cli(moto, "plan", "--cluster", "prod"))
    assert lines == [
        f"note: {NODE_A}: no GpuNodeUnderutilized alarm: GPU 1 in MIG mode report(s) no "
        "utilization, so the node is never called idle",
        f"+ create  gpuscope/prod/{NODE_A}/GpuTemperatureHigh",
        "Plan: 1 to create, 0 to update, 0 to delete, 0 unchanged.",
    ]


def test_an_alarm_a_publishing_node_no_longer_gets_is_not_called_gone(moto: str) -> None:
    # The node's GPU 1 goes into MIG mode: its idle alarm (on a rollup that now leaves the
    # working slices out) is no longer wanted. The node still publishes: the stale line must
    # not say it stopped, and --prune deletes the alarm.
    publish(moto, "prod", NODE_A, 2)
    ok(alarms_cli(moto, "apply", "--cluster", "prod"))
    publish(moto, "prod", NODE_A, 2, mig_slices=("1/1", "1/2"))
    idle = f"gpuscope/prod/{NODE_A}/GpuNodeUnderutilized"
    assert ok(alarms_cli(moto, "plan", "--cluster", "prod")) == [
        f"note: {NODE_A}: no GpuNodeUnderutilized alarm: GPU 1 in MIG mode report(s) no "
        "utilization, so the node is never called idle",
        f"! stale   {idle} (its node still publishes GPU metrics, but this alarm no longer "
        "applies to it; --prune deletes it)",
        "No changes: 1 alarm(s) up to date.",
    ]
    assert ok(alarms_cli(moto, "apply", "--cluster", "prod", "--prune")) == [
        f"note: {NODE_A}: no GpuNodeUnderutilized alarm: GPU 1 in MIG mode report(s) no "
        "utilization, so the node is never called idle",
        f"- delete  {idle}",
        "Applied: 0 to create, 0 to update, 1 to delete, 1 unchanged.",
    ]
    assert idle not in alarms(moto)


def test_agent_dimensions_mig_node_gets_no_idle_alarm_and_notes_say_why(moto: str) -> None:
    # --cloudwatch-device-dimensions agent: the per-GPU series carry no ClusterName, the node
    # rollup does. The MIG node's rollup holds its idle whole GPU only (slices report no
    # utilization): an alarm on it fired while the slices worked.
    publish(moto, "prod", NODE_A, 2, mig_slices=("1/1", "1/2"), agent_only=True, gpm=True)
    publish(moto, "prod", NODE_B, 1, agent_only=True)
    lines = ok(alarms_cli(moto, "plan", "--cluster", "prod"))
    assert lines == [
        f"note: {NODE_A}: no GpuNodeUnderutilized alarm: GPU 1 in MIG mode report(s) no "
        "utilization, so the node is never called idle",
        f"note: {NODE_A}: no GpuTemperatureHigh alarm: its per-GPU metrics carry no "
        "ClusterName (the exporter's --cloudwatch-device-dimensions is 'agent'; 'both' or "
        "'extended' adds it)",
        f"note: {NODE_B}: no GpuTemperatureHigh alarm: its per-GPU metrics carry no "
        "ClusterName (the exporter's --cloudwatch-device-dimensions is 'agent'; 'both' or "
        "'extended' adds it)",
        f"+ create  gpuscope/prod/{NODE_B}/GpuNodeUnderutilized",
        "Plan: 1 to create, 0 to update, 0 to delete, 0 unchanged.",
    ]


def test_many_agent_dimension_nodes_share_one_listing(moto: str) -> None:
    # Each node publishing the agent's per-GPU set alone was looked up with a ListMetrics
    # call of its own: 500 sequential calls for 500 nodes (some 25 a second are allowed).
    nodes = [f"ip-10-0-9-{i}.ec2.internal" for i in range(6)]
    for node in nodes[:5]:
        publish(moto, "prod", node, 1, agent_only=True)
    publish(moto, "prod", nodes[5], 2, mig_slices=("1/1",), agent_only=True)
    publish(moto, "dev", "ip-10-0-9-99.ec2.internal", 1, mig_slices=("0/1",), agent_only=True)
    calls: list[dict[str, Any]] = []
    cw = client(moto)

    class Counting:
        def list_metrics(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return cw.list_metrics(**kwargs)

    found = discover(Counting(), Options(command="plan", cluster="prod"))  # type: ignore[arg-type]
    lookups = [c for c in calls if c["MetricName"] == "nvidia_smi_memory_used"
               and not any(d["Name"] == "ClusterName" for d in c["Dimensions"])]
    assert [c["Dimensions"] for c in lookups] == [[]]
    assert sorted(found) == nodes
    assert [dict(d)["index"] for d in found[nodes[5]].agent_gpu_memory] == ["0", "1", "1/1"]
    assert all(len(found[n].agent_gpu_memory) == 1 for n in nodes[:5])


def test_gpm_node_gets_a_spinning_alarm(moto: str) -> None:
    # An H100 node with GPM and the node rollups; the A100 node beside it has no GPM.
    publish(moto, "prod", NODE_A, 8, gpm=True, instance_type="p5.48xlarge")
    publish(moto, "prod", NODE_B, 1)
    lines = ok(alarms_cli(moto, "apply", "--cluster", "prod", "--spin-minutes", "30"))
    spinning = f"gpuscope/prod/{NODE_A}/GpuSpinning"
    assert f"+ create  {spinning}" in lines
    assert not any("GpuSpinning" in line and NODE_B in line for line in lines)
    alarm = alarms(moto)[spinning]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == (
        "GreaterThanOrEqualToThreshold", 1.0)
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 6  # 6 x 5 min
    assert alarm["TreatMissingData"] == "notBreaching"
    queries = {q["Id"]: q for q in alarm["Metrics"]}
    assert queries["spinning"]["Expression"] == (
        "IF(util >= 50 AND sm < 30 AND tensor < 2, 1, 0)")
    assert queries["spinning"]["ReturnData"] is True
    node = {"ClusterName": "prod", "NodeName": NODE_A, "InstanceType": "p5.48xlarge"}
    for qid, name, stat in (("util", "node_gpu_utilization", "Minimum"),
                            ("sm", "node_gpu_sm_active", "Maximum"),
                            ("tensor", "node_gpu_tensor_active", "Maximum")):
        metric = queries[qid]["MetricStat"]
        assert (metric["Metric"]["MetricName"], metric["Stat"], metric["Period"]) == (
            name, stat, 300)
        assert {d["Name"]: d["Value"] for d in metric["Metric"]["Dimensions"]} == node
        assert queries[qid]["ReturnData"] is False
    # Up to date on a second run; a new duration is an update.
    assert ok(alarms_cli(moto, "apply", "--cluster", "prod"))[-1].startswith("No changes")
    planned = ok(alarms_cli(moto, "plan", "--cluster", "prod", "--spin-minutes", "60"))
    assert any(line.startswith(f"~ update  {spinning}: ") and "EvaluationPeriods 6 -> 12"
               in line for line in planned)


def test_every_alarm_carries_the_cluster_and_one_series_per_node(moto: str) -> None:
    # With --instance-id the sink publishes each node rollup three times (the node's set,
    # Container Insights' set with InstanceId, the cluster's); another cluster has a node
    # of the same name. Each alarm reads the node's own set, of this cluster only.
    publish(moto, "prod", NODE_A, 8, gpm=True, instance_type="p5.48xlarge",
            instance_id="i-0aaaaaaaaaaaaaaaa")
    publish(moto, "prod", NODE_B, 1, rollup=False, instance_id="i-0bbbbbbbbbbbbbbbb")
    publish(moto, "staging", NODE_A, 8, gpm=True, instance_type="p5.48xlarge",
            instance_id="i-0cccccccccccccccc")
    ok(alarms_cli(moto, "apply", "--cluster", "prod"))
    created = alarms(moto)
    assert set(created) == {f"gpuscope/prod/{NODE_A}/GpuNodeUnderutilized",
                            f"gpuscope/prod/{NODE_A}/GpuTemperatureHigh",
                            f"gpuscope/prod/{NODE_A}/GpuSpinning",
                            f"gpuscope/prod/{NODE_B}/GpuNodeUnderutilized",
                            f"gpuscope/prod/{NODE_B}/GpuTemperatureHigh"}
    node_set = {"ClusterName": "prod", "NodeName": NODE_A, "InstanceType": "p5.48xlarge"}
    for name, alarm in created.items():
        metrics = ([(alarm["MetricName"], alarm["Dimensions"])] if alarm.get("MetricName")
                   else [(q["MetricStat"]["Metric"]["MetricName"],
                          q["MetricStat"]["Metric"]["Dimensions"])
                         for q in alarm["Metrics"] if "MetricStat" in q])
        assert metrics, name
        for metric, dims in metrics:
            named = {d["Name"]: d["Value"] for d in dims}
            assert named["ClusterName"] == "prod", (name, metric)
            if metric.startswith("node_gpu_"):
                assert named == node_set, (name, metric)
            else:
                assert named["host"] == name.split("/")[2], (name, metric)
    # The single-metric idle alarm on the node rollup, not metric math over three copies.
    idle = created[f"gpuscope/prod/{NODE_A}/GpuNodeUnderutilized"]
    assert idle["MetricName"] == "node_gpu_utilization" and idle["Statistic"] == "Maximum"


def test_unknown_node_is_one_line_and_exit_2(fleet: str) -> None:
    result = alarms_cli(fleet, "plan", "--cluster", "prod", "--node", "ip-10-0-0-0.nowhere")
    assert result.returncode == 2
    assert result.stderr == ("gpuscope-alarms: error: --node ip-10-0-0-0.nowhere: no recent "
                             "GPU metrics for it in cluster 'prod', namespace 'CWAgent'\n")


def test_cluster_without_metrics_plans_nothing(moto: str) -> None:
    lines = ok(alarms_cli(moto, "plan", "--cluster", "empty"))
    assert lines == ["note: no node of cluster 'empty' published GPU metrics to 'CWAgent' in "
                     "the last 3 hours", "No changes: 0 alarm(s) up to date."]


def test_more_gpus_than_one_alarm_holds(moto: str) -> None:
    publish(moto, "prod", "big-node", 16)
    publish(moto, "prod", "big-node-no-rollup", 16, rollup=False)
    opts = Options(command="plan", cluster="prod", region=REGION, endpoint_url=moto)
    desired, notes = desired_alarms(opts, discover(client(moto), opts))
    # The rollup needs one metric whatever the GPU count; 16 GPU series do not fit one alarm.
    assert [(a["AlarmName"], a.get("MetricName")) for a in desired] == [
        ("gpuscope/prod/big-node/GpuNodeUnderutilized", "node_gpu_utilization")]
    assert notes == [
        "big-node: no GpuTemperatureHigh alarm: 16 nvidia_smi_temperature_gpu series, more "
        "than 9",
        "big-node-no-rollup: no GpuNodeUnderutilized alarm: 0 node_gpu_utilization and 16 "
        "nvidia_smi_utilization_gpu series",
        "big-node-no-rollup: no GpuTemperatureHigh alarm: 16 nvidia_smi_temperature_gpu "
        "series, more than 9",
    ]


def test_canonical_treats_aws_defaults_as_equal() -> None:
    asked = {"AlarmName": "a", "EvaluationPeriods": 3, "Threshold": 5, "ComparisonOperator":
             "LessThanThreshold", "Dimensions": [{"Name": "b", "Value": "2"},
                                                  {"Name": "a", "Value": "1"}]}
    described = {**asked, "Threshold": 5.0, "DatapointsToAlarm": 3, "OKActions": [],
                 "TreatMissingData": "missing", "Metrics": [],
                 "Dimensions": [{"Name": "a", "Value": "1"}, {"Name": "b", "Value": "2"}]}
    assert canonical(asked) == canonical(described)


@pytest.mark.parametrize(("args", "message"), [
    (["apply"], "the following arguments are required: --cluster"),
    (["destroy", "--cluster", "prod"], "argument command: invalid choice: 'destroy'"),
    (["plan", "--cluster", "prod/eu"], "--cluster: expected letters, digits"),
    (["plan", "--cluster", "prod", "--sns-topic-arn", "arn:aws:sqs:us-east-1:1:q"],
     "--sns-topic-arn: not an SNS topic ARN"),
    (["plan", "--cluster", "prod", "--idle-threshold", "150"], "--idle-threshold: expected"),
    (["plan", "--cluster", "prod", "--idle-threshold", "nan"], "--idle-threshold: expected"),
    (["plan", "--cluster", "prod", "--idle-threshold", "five"], "invalid float value: 'five'"),
    (["plan", "--cluster", "prod", "--idle-minutes", "7"], "--idle-minutes: expected a multiple"),
    (["plan", "--cluster", "prod", "--spin-minutes", "3"], "--spin-minutes: expected a multiple"),
    (["plan", "--cluster", "prod", "--temperature", "200"], "--temperature: expected 30 to 120"),
    (["plan", "--cluster", "prod", "--region", "mars-1"], "--region: not an AWS region name"),
    (["plan", "--cluster", "prod", "--endpoint-url", "localhost:4566"], "--endpoint-url"),
    # Each of these passed the prefix check and ended in a ValueError traceback in botocore
    # (bad port, bad IPv6) or in the error line that echoed the URL (a password).
    (["plan", "--cluster", "prod", "--endpoint-url", "http://localhost:99999"],
     "--endpoint-url: bad port in 'http://localhost:99999'"),
    (["plan", "--cluster", "prod", "--endpoint-url", "http://localhost:port"],
     "--endpoint-url: bad port"),
    (["plan", "--cluster", "prod", "--endpoint-url", "http://[::1"], "--endpoint-url: "),
    (["plan", "--cluster", "prod", "--endpoint-url", "http://user:secret@localhost:4566"],
     "--endpoint-url: the URL must not hold credentials"),
    (["plan", "--cluster", "prod", "--node", "a/b"], "--node: not a node name: 'a/b'"),
    (["plan", "--cluster", "prod", "--alarm-prefix", "gpu scope"], "--alarm-prefix"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.alarms", *args, *(
            [] if "--region" in args else ["--region", REGION])],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("gpuscope-alarms: error: ")
    assert message in result.stderr
    assert "secret" not in result.stderr


def test_missing_region_is_one_line_and_exit_2() -> None:
    result = subprocess.run([sys.executable, "-m", "gpuscope.alerts.alarms",
                             "plan", "--cluster", "prod"],
                            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (
        2, "gpuscope-alarms: error: no AWS region: pass --region or set AWS_REGION\n")


def test_bad_aws_environment_is_one_line_and_exit_2() -> None:
    """An AWS variable botocore cannot read (AWS_MAX_ATTEMPTS=abc) while the client is made
    was a ValueError traceback."""
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = alarms_cli(url, "plan", "--cluster", "prod", env={"AWS_MAX_ATTEMPTS": "abc"})
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "gpuscope-alarms: error: cannot create the CloudWatch client: "), result.stderr


def test_unreachable_endpoint_is_one_line_and_exit_1() -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = alarms_cli(url, "plan", "--cluster", "prod", env={"AWS_MAX_ATTEMPTS": "1"})
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("gpuscope-alarms: error: Could not connect to the endpoint")


def test_aws_error_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from botocore.exceptions import ClientError

    from gpuscope.alerts import alarms

    class Denied:
        def list_metrics(self, **kwargs: Any) -> dict[str, Any]:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message":
                                         "User: arn:aws:iam::1:user/x is not authorized\n"
                                         "to perform: cloudwatch:ListMetrics"}}, "ListMetrics")

    monkeypatch.setattr(alarms, "make_client", lambda opts: Denied())
    assert alarms.main(["plan", "--cluster", "prod", "--region", REGION]) == 1
    assert capsys.readouterr().err == (
        "gpuscope-alarms: error: AWS AccessDenied: User: arn:aws:iam::1:user/x is not "
        "authorized to perform: cloudwatch:ListMetrics\n")


def test_botocore_without_boto3_is_one_line_and_exit_1(tmp_path: Any) -> None:
    """botocore importable, boto3 not (an environment with the AWS CLI v1, which brings
    botocore alone): was a ModuleNotFoundError traceback from make_client."""
    (tmp_path / "boto3").mkdir()
    (tmp_path / "boto3" / "__init__.py").write_text("raise ImportError('no boto3 here')\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.alarms", "plan", "--cluster", "prod",
         "--region", REGION],
        cwd=REPO, env={**ENV, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "gpuscope-alarms: error: boto3 is not installed (pip install boto3)\n")
