"""Against a real moto server over HTTP: what lands in CloudWatch after one interval.

The sink runs as in the exporter — a Sampler listener after the Attributor, snapshots from
the SimulatedSource, attribution from the scenario's pods — on a controlled clock, with a
real boto3 client whose requests go through the recording proxy to moto.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gpuscope.exporter.kubernetes.attribution import HOST, Attribution, Attributor
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs
from gpuscope.exporter.model import DeviceSample, Snapshot
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity
from gpuscope.exporter.sinks.cloudwatch.batching import MAX_DATUMS_PER_REQUEST, MAX_REQUEST_BYTES
from gpuscope.exporter.sources.scenario import (
    Scenario,
    load_default_scenario,
    scenario_from_yaml,
    synthetic_scenario,
)
from gpuscope.exporter.sources.simulated import SimulatedSource
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.helpers import (
    MIB,
    FakeClock,
    expected_aggregates,
    gpu,
    list_all_metrics,
    minute_start,
    moto_sink,
    read_aggregates,
    snapshot,
)
from tests.exporter.sinks.cloudwatch.wire import WireProxy

# Every value below is a multiple of 1/8 (percent, W, degrees C, MiB), so sums are exact
# in any order and "exactly" means ==, not approx. GPU 0 holds 25 % with a one-second spike
# to 100 % at second 30; GPU 1 is time-sliced by two pods (0.125 + a 0.125/0.625 square
# wave); GPU 2 is in MIG mode with a GPM slice at 50 % and an idle allocated slice.
SCENARIO = """
version: 1
node: {name: gpu-node-a, instance_type: p4d.24xlarge, zone: us-east-1a, seed: 3}
gpus:
  - count: 2
    model: NVIDIA A100-SXM4-80GB
    power_limit: 400
    power_idle: 80
    temperature: {idle: 32, busy: 72}
    sm_clock: {idle: 210MHz, busy: 1410MHz}
    memory_clock: 1593MHz
    fan_speed: {idle: 0.25, busy: 0.75}
    memory_utilization_factor: 0.5
  - model: NVIDIA A100-SXM4-80GB
    power_limit: 300
    power_idle: 300
    temperature: {idle: 40, busy: 40}
    fan_speed: {idle: 0.5, busy: 0.5}
    mig:
      - {profile: 3g.40gb, gpu_instance_id: 1, utilization_supported: true}
      - {profile: 3g.40gb, gpu_instance_id: 2}
pods:
  - namespace: ml
    name: train-0
    containers: [{name: pytorch, gpus: [0]}]
  - namespace: serving
    name: chat-a
    containers: [{name: server, gpus: ["1::0"]}]
  - namespace: serving
    name: chat-b
    containers: [{name: server, gpus: ["1::1"]}]
  - namespace: serving
    name: triton
    containers: [{name: triton, gpus: ["2/1"]}]
  - namespace: research
    name: idle
    containers: [{name: notebook, gpus: ["2/2"]}]
processes:
  - pid: 100
    gpu: 0
    memory: 40GiB
    utilization: {pattern: stepped, steps: [[0, 0.25], [30, 1.0], [31, 0.25]], repeat: 60}
    pod: ml/train-0/pytorch
  - {pid: 200, gpu: 1, memory: 8GiB, utilization: 0.125, pod: serving/chat-a/server}
  - pid: 201
    gpu: 1
    memory: 8GiB
    utilization: {pattern: bursty, low: 0.125, high: 0.625, period: 8, duty: 0.5}
    pod: serving/chat-b/server
  - {pid: 300, gpu: "2/1", memory: 16GiB, utilization: 0.5, pod: serving/triton/triton}
  - {pid: 999, gpu: 1, memory: 1GiB, utilization: 0}
"""

NODE = "gpu-node-a"
CLUSTER = "prod-east"
INSTANCE_ID = "i-0123456789abcdef0"
Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass
class Run:
    """One simulated node feeding the sink: the rounds it saw, and the sink."""

    clock: FakeClock
    sink: CloudWatchSink
    sampler: Sampler
    rounds: list[tuple[Snapshot, Attribution | None]] = field(default_factory=list)

    def play(self, seconds: int, every: int = 1) -> None:
        """A round every ``every`` seconds for ``seconds`` seconds, half a second into each
        second (rounds at 0.5, 3.5, … 30.5 … with ``every=3``)."""
        for _ in range(0, seconds, every):
            self.clock.t = math.floor(self.clock.t) + 0.5
            self.sampler.run_once()
            self.clock.advance(float(every))

    def close_interval(self) -> None:
        self.clock.t = math.floor(self.clock.t / 60) * 60 + 2.5  # past the grace
        self.sink.tick()


def start_run(scenario: Scenario, proxy: WireProxy, identity: Identity,
              t0: float | None = None) -> Run:
    t0 = minute_start() if t0 is None else t0
    clock = FakeClock(t0)
    source = SimulatedSource(scenario, clock=clock.time, start=t0)
    attributor = Attributor(ScenarioInputs(scenario))
    sink = moto_sink(clock, proxy.url, identity=identity, attribution_of=attributor.latest)
    run = Run(clock, sink, Sampler(source, 1.0, clock=clock.time, monotonic=clock.monotonic))
    run.sampler = Sampler(
        source, 1.0, clock=clock.time, monotonic=clock.monotonic,
        listeners=(attributor, sink,
                   lambda snap: run.rounds.append((snap, attributor.latest()))),
    )
    return run


def expected_samples(rounds: list[tuple[Snapshot, Attribution | None]], identity: Identity,
                     instance_type: str) -> dict[Key, list[float]]:
    """What the agent and Container Insights would publish for these rounds, written out
    from the documented rules (docs/cloudwatch.md), independently of the sink's code."""
    out: dict[Key, list[float]] = {}

    def add(name: str, dims: dict[str, str], value: float | None) -> None:
        if value is not None:
            out.setdefault((name, frozenset(dims.items())), []).append(value)

    cluster = identity.cluster_name or ""
    # A node rollup's sets: gpuscope's node set, Container Insights' (with the instance ID,
    # when known), the cluster.
    node_sets = [{"ClusterName": cluster, "NodeName": identity.host,
                  "InstanceType": instance_type}]
    if identity.instance_id:
        node_sets.append({"ClusterName": cluster, "NodeName": identity.host,
                          "InstanceId": identity.instance_id})
    node_sets.append({"ClusterName": cluster})

    last: dict[str, tuple[float, DeviceSample]] = {}  # each device's previous round
    for snap, attribution in rounds:
        for d in snap.devices:
            agent = {"host": identity.host, "index": d.index, "name": d.model,
                     "arch": d.architecture or ""}
            extended = {**agent, "InstanceType": instance_type, "ClusterName": cluster}
            if identity.instance_id:
                extended["InstanceId"] = identity.instance_id
            used, total = d.memory_used_bytes, d.memory_total_bytes
            values = {
                "nvidia_smi_utilization_gpu":
                    None if d.utilization_ratio is None else d.utilization_ratio * 100,
                "nvidia_smi_utilization_memory": None if d.memory_utilization_ratio is None
                else d.memory_utilization_ratio * 100,
                "nvidia_smi_memory_total": None if total is None else total / MIB,
                "nvidia_smi_memory_used": None if used is None else used / MIB,
                "nvidia_smi_memory_free":
                    None if used is None or total is None else (total - used) / MIB,
                "nvidia_smi_temperature_gpu": d.temperature_celsius,
                "nvidia_smi_power_draw": d.power_watts,
                "nvidia_smi_fan_speed":
                    None if d.fan_speed_ratio is None else d.fan_speed_ratio * 100,
                "nvidia_smi_clocks_current_sm":
                    None if d.sm_clock_hertz is None else d.sm_clock_hertz / 1e6,
                "nvidia_smi_clocks_current_memory":
                    None if d.memory_clock_hertz is None else d.memory_clock_hertz / 1e6,
            }
            for name, value in values.items():
                add(name, agent, value)
                add(name, extended, value)
            if d.utilization_ratio is not None:
                for dims in node_sets:
                    add("node_gpu_utilization", dims, d.utilization_ratio * 100)
            # GPM activities: a counter's increase since the device's previous round over the
            # time between them, in percent (none on its first round).
            previous = last.get(d.uuid)
            last[d.uuid] = (snap.timestamp, d)
            for name, rollup, counter in (
                ("nvidia_gpm_sm_active", "node_gpu_sm_active", "sm_active_seconds"),
                ("nvidia_gpm_tensor_active", "node_gpu_tensor_active", "tensor_active_seconds"),
            ):
                now = getattr(d, counter)
                if previous is None or now is None or getattr(previous[1], counter) is None:
                    continue
                value = round(100 * (now - getattr(previous[1], counter))
                              / (snap.timestamp - previous[0]), 3)
                add(name, agent, value)
                add(name, extended, value)
                for dims in node_sets:
                    add(rollup, dims, value)
        assert attribution is not None and attribution.timestamp == snap.timestamp
        pods: dict[tuple[str, str, str], list[float | None]] = {}
        for u in attribution.containers:
            if u.key == HOST:
                continue
            util_mem = pods.setdefault((u.key.namespace, u.key.pod, u.uuid), [None, None])
            if u.utilization_ratio is not None:
                util_mem[0] = (util_mem[0] or 0.0) + u.utilization_ratio
            if u.memory_used_bytes is not None:
                util_mem[1] = (util_mem[1] or 0.0) + u.memory_used_bytes
        for (ns, pod, _), (util, mem) in pods.items():
            # The pod, its namespace, its cluster: the same value under each.
            for dims in ({"ClusterName": cluster, "Namespace": ns, "PodName": pod},
                         {"ClusterName": cluster, "Namespace": ns}, {"ClusterName": cluster}):
                add("pod_gpu_utilization", dims, None if util is None else util * 100)
                add("pod_gpu_memory_used", dims, mem)
    return out


@pytest.fixture
def identity() -> Iterator[Identity]:
    yield Identity(host=NODE, cluster_name=CLUSTER, instance_id=INSTANCE_ID)


def test_one_interval_lands_with_agent_names_dimensions_and_exact_aggregates(
    moto: MotoServer, proxy: WireProxy, identity: Identity
) -> None:
    run = start_run(scenario_from_yaml(SCENARIO), proxy, identity)
    t0 = run.clock.t
    # A round every 5 s: 12 per interval, the spike at 30.5 s among them. (moto answers
    # list_metrics and get_metric_data in O(stored samples x series): 60 rounds would
    # cost seconds.)
    run.play(60, every=5)
    run.close_interval()

    puts = proxy.put_requests()
    assert len(puts) == 1 and puts[0].status == 200
    assert puts[0].namespace == "CWAgent"
    client = moto.client()
    expected = expected_samples(run.rounds, identity, "p4d.24xlarge")
    # list_metrics: every expected series, with the agent's names and dimension sets, and
    # nothing else.
    names = {name for name, _ in expected}
    listed = list_all_metrics(client, "CWAgent", names)
    assert set(listed) == set(expected)
    assert {d["MetricName"] for d in puts[0].datums} == names  # and nothing else
    assert names == {
        "nvidia_smi_utilization_gpu", "nvidia_smi_utilization_memory",
        "nvidia_smi_memory_total", "nvidia_smi_memory_used", "nvidia_smi_memory_free",
        "nvidia_smi_temperature_gpu", "nvidia_smi_power_draw", "nvidia_smi_fan_speed",
        "nvidia_smi_clocks_current_sm", "nvidia_smi_clocks_current_memory",
        "pod_gpu_utilization", "pod_gpu_memory_used", "node_gpu_utilization",
    }
    # get_metric_data: minimum, maximum, sum and count of every series, exactly.
    got = read_aggregates(client, "CWAgent", [(n, listed[(n, d)]) for n, d in expected],
                          t0, t0 + 60)
    want = expected_aggregates(expected)
    assert {k: v[0] for k, v in got.items()} == want
    # The one-second spike, spelled out.
    gpu0 = frozenset({("host", NODE), ("index", "0"), ("name", "NVIDIA A100-SXM4-80GB"),
                      ("arch", "Ampere")})
    assert got[("nvidia_smi_utilization_gpu", gpu0)] == [
        {"Minimum": 25.0, "Maximum": 100.0, "Sum": 11 * 25.0 + 100.0, "SampleCount": 12.0}]
    train = frozenset({("ClusterName", CLUSTER), ("Namespace", "ml"), ("PodName", "train-0")})
    assert got[("pod_gpu_utilization", train)][0]["Maximum"] == 100.0
    # Time-sliced pods each get their own number, not the device's.
    chat_a = frozenset({("ClusterName", CLUSTER), ("Namespace", "serving"),
                        ("PodName", "chat-a")})
    assert got[("pod_gpu_utilization", chat_a)] == [
        {"Minimum": 12.5, "Maximum": 12.5, "Sum": 150.0, "SampleCount": 12.0}]


def test_default_scenario_publishes_every_agent_metric_and_dimension_set(
    moto: MotoServer, proxy: WireProxy, identity: Identity
) -> None:
    run = start_run(load_default_scenario(), proxy, identity)
    t0 = run.clock.t
    run.play(60, every=10)  # rounds at 0.5, 10.5, … s: GPU 2's bursts at 0.5 and 20.5
    run.close_interval()
    expected = expected_samples(run.rounds, identity, "p5.48xlarge")
    sent_names = {d["MetricName"] for p in proxy.put_requests() for d in p.datums}
    assert sent_names == {name for name, _ in expected}
    listed = list_all_metrics(moto.client(), "CWAgent", sent_names)
    found = set(listed)
    assert found == set(expected)
    key_sets: dict[str, set[frozenset[str]]] = {}
    for name, dims in found:
        key_sets.setdefault(name, set()).add(frozenset(k for k, _ in dims))
    agent = frozenset({"host", "index", "name", "arch"})
    extended = agent | {"InstanceId", "InstanceType", "ClusterName"}
    for name in key_sets:
        if name.startswith("nvidia_smi_"):
            assert key_sets[name] == {agent, extended}, name
    assert "nvidia_smi_fan_speed" not in key_sets  # H100 SXM: no fan, no made-up 0
    # Container Insights' pod_gpu_* sets without Service, FullPodName and GpuDevice; its
    # node_gpu_* sets without GpuDevice, plus gpuscope's own node set (docs/cloudwatch.md).
    assert key_sets["pod_gpu_utilization"] == {
        frozenset({"ClusterName", "Namespace", "PodName"}),
        frozenset({"ClusterName", "Namespace"}), frozenset({"ClusterName"})}
    assert key_sets["pod_gpu_memory_used"] == key_sets["pod_gpu_utilization"]
    node_sets = {frozenset({"ClusterName", "NodeName", "InstanceType"}),
                 frozenset({"ClusterName", "NodeName", "InstanceId"}), frozenset({"ClusterName"})}
    for rollup in ("node_gpu_utilization", "node_gpu_sm_active", "node_gpu_tensor_active"):
        assert key_sets[rollup] == node_sets, rollup
    # Every rollup carries ClusterName.
    assert all("ClusterName" in keys for name in ("pod_gpu_utilization", "pod_gpu_memory_used",
                                                 "node_gpu_utilization") for keys in key_sets[name])
    indexes = {dict(d)["index"] for n, d in found if n == "nvidia_smi_memory_used"}
    assert indexes == {"0", "1", "2", "3", "4", "5", "6", "7", "7/1", "7/5", "7/13", "7/14"}
    # Aggregates of a few series (test_one_interval_… checks every series exactly).
    bursty = frozenset({("host", NODE), ("index", "2"), ("name", "NVIDIA H100 80GB HBM3"),
                        ("arch", "Hopper")})
    starved = frozenset({("ClusterName", CLUSTER), ("Namespace", "serving"),
                         ("PodName", "rerank-api-6b8c7d9f5-m3n8z")})
    node = frozenset({("ClusterName", CLUSTER), ("NodeName", NODE),
                      ("InstanceType", "p5.48xlarge")})
    serving = frozenset({("ClusterName", CLUSTER), ("Namespace", "serving")})
    keys = [("nvidia_smi_utilization_gpu", bursty), ("pod_gpu_utilization", starved),
            ("node_gpu_utilization", node), ("pod_gpu_utilization", serving)]
    got = read_aggregates(moto.client(), "CWAgent", [(n, listed[(n, d)]) for n, d in keys],
                          t0, t0 + 60)
    want = expected_aggregates({k: expected[k] for k in keys})
    for key in keys:
        assert got[key][0] == pytest.approx(want[key], abs=0.05), key
    assert got[keys[0]][0]["Maximum"] == 95.0 and got[keys[0]][0]["Minimum"] == 5.0
    assert got[keys[2]][0]["SampleCount"] == 6.0 * 8  # 7 GPUs + the GPM slice 7/1


def test_existing_agent_alarm_finds_our_data(
    moto: MotoServer, proxy: WireProxy, identity: Identity
) -> None:
    client = moto.client()
    # The alarm a team built on the CloudWatch agent's data, before gpuscope existed.
    alarm_dims = [{"Name": "host", "Value": NODE}, {"Name": "index", "Value": "0"},
                  {"Name": "name", "Value": "NVIDIA A100-SXM4-80GB"},
                  {"Name": "arch", "Value": "Ampere"}]
    client.put_metric_alarm(
        AlarmName="gpu0-hot", Namespace="CWAgent", MetricName="nvidia_smi_utilization_gpu",
        Dimensions=alarm_dims, Statistic="Maximum", Period=60, EvaluationPeriods=1,
        Threshold=95.0, ComparisonOperator="GreaterThanThreshold",
    )
    run = start_run(scenario_from_yaml(SCENARIO), proxy, identity)
    t0 = run.clock.t
    run.play(60, every=5)
    run.close_interval()

    alarms = client.describe_alarms_for_metric(
        MetricName="nvidia_smi_utilization_gpu", Namespace="CWAgent", Dimensions=alarm_dims
    )["MetricAlarms"]
    assert [a["AlarmName"] for a in alarms] == ["gpu0-hot"]
    alarm = alarms[0]
    # The query the alarm evaluates, exactly as it is defined (moto does not evaluate
    # alarms): our data is there, and the one-second spike breaches the threshold.
    from datetime import UTC, datetime

    result = client.get_metric_data(
        MetricDataQueries=[{"Id": "alarm", "MetricStat": {
            "Metric": {"Namespace": alarm["Namespace"], "MetricName": alarm["MetricName"],
                       "Dimensions": alarm["Dimensions"]},
            "Period": alarm["Period"], "Stat": alarm["Statistic"]}}],
        StartTime=datetime.fromtimestamp(t0, tz=UTC),
        EndTime=datetime.fromtimestamp(t0 + 59, tz=UTC),
    )["MetricDataResults"][0]
    assert result["Values"] == [100.0] and result["Values"][0] > alarm["Threshold"]


def test_one_request_per_interval_for_8_gpus_and_32_pods(
    moto: MotoServer, proxy: WireProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = synthetic_scenario(gpus=8, processes_per_gpu=4, seed=1)
    assert len(scenario.pods) == 32
    identity = Identity(host="synthetic", cluster_name=CLUSTER, instance_id=INSTANCE_ID)
    run = start_run(scenario, proxy, identity)
    intervals = 3
    for _ in range(intervals):
        run.play(60)
        run.close_interval()
    puts = proxy.put_requests()
    assert len(puts) == intervals  # one PutMetricData per node per interval
    assert all(p.status == 200 for p in puts)
    assert {len({d["Timestamp"] for d in p.datums}) for p in puts} == {1}
    for p in puts:
        assert len(p.datums) <= MAX_DATUMS_PER_REQUEST
        assert len(p.body) <= MAX_REQUEST_BYTES
    pods = {x["Value"] for p in puts for d in p.datums if d["MetricName"].startswith("pod_")
            for x in d["Dimensions"] if x["Name"] == "PodName"}
    assert len(pods) == 32
    with capsys.disabled():
        print(f"\n[cloudwatch] 8 GPUs x 32 pods, 60 samples per 60 s interval: "
              f"{len(puts)} PutMetricData requests for {intervals} intervals; datums per "
              f"request {[len(p.datums) for p in puts]}; body bytes "
              f"{[len(p.body) for p in puts]} (gzipped on the wire "
              f"{[p.wire_bytes for p in puts]}); a per-sample publisher: "
              f"{60 * intervals} requests")


def test_a_series_split_over_150_values_is_merged_back(moto: MotoServer, proxy: WireProxy
                                                       ) -> None:
    t0 = minute_start()
    clock = FakeClock(t0)
    sink = moto_sink(clock, proxy.url, identity=Identity(host="h"))
    percents = [i * 0.125 for i in range(1, 156)]  # 155 distinct values, exact in binary
    ratios = [p / 100 for p in percents]
    for i, ratio in enumerate(ratios):
        sink(snapshot(t0 + i * 0.38, [gpu(0, ratio)]))
    clock.t = t0 + 63
    sink.tick()
    datums = [d for p in proxy.put_requests() for d in p.datums
              if d["MetricName"] == "nvidia_smi_utilization_gpu"]
    assert [len(d["Values"]) for d in datums] == [150, 5]
    listed = list_all_metrics(moto.client(), "CWAgent", ["nvidia_smi_utilization_gpu"])
    (key, dims), = listed.items()
    got = read_aggregates(moto.client(), "CWAgent", [(key[0], dims)], t0, t0 + 60)
    assert got[key] == [{"Minimum": 0.125, "Maximum": 155 * 0.125,
                         "Sum": math.fsum(percents), "SampleCount": 155.0}]


ROLLUPS = ("pod_gpu_utilization", "pod_gpu_memory_used", "node_gpu_utilization")
SAME_NAME = "ip-10-0-1-23.ec2.internal"  # eksctl's default VPC in two clusters: one name
IDLE_SCENARIO = f"""
version: 1
node: {{name: {SAME_NAME}, instance_type: p4d.24xlarge, zone: us-west-2a, seed: 5}}
gpus:
  - count: 2
    model: NVIDIA A100-SXM4-80GB
pods:
  - namespace: ml
    name: idle-0
    containers: [{{name: main, gpus: [0]}}]
"""


def test_two_clusters_with_one_node_name_stay_apart_and_cluster_series_merge_nodes(
    moto: MotoServer, proxy: WireProxy
) -> None:
    # prod-east: two busy nodes, one named like prod-west's idle node. Every node's sink
    # publishes on its own; CloudWatch merges the datums of the per-namespace and per-cluster
    # series of one cluster's nodes, and keeps the two clusters' same-named nodes apart.
    t0 = minute_start()
    east = "prod-east"
    busy = SCENARIO.replace("name: gpu-node-a", f"name: {SAME_NAME}")
    nodes = [
        (busy, Identity(host=SAME_NAME, cluster_name=east, instance_id=INSTANCE_ID)),
        (SCENARIO, Identity(host="gpu-node-a", cluster_name=east)),
        (IDLE_SCENARIO, Identity(host=SAME_NAME, cluster_name="prod-west",
                                 instance_id="i-0fedcba9876543210")),
    ]
    runs = [start_run(scenario_from_yaml(text), proxy, ident, t0) for text, ident in nodes]
    for run in runs:
        run.play(60, every=5)
        run.close_interval()
    assert len(proxy.put_requests()) == 3  # one request per node

    expected: dict[Key, list[float]] = {}
    for run, (_, ident) in zip(runs, nodes, strict=True):
        for key, values in expected_samples(run.rounds, ident, "p4d.24xlarge").items():
            if key[0] in ROLLUPS:
                expected.setdefault(key, []).extend(values)
    client = moto.client()
    listed = list_all_metrics(client, "CWAgent", ROLLUPS)
    assert set(listed) == set(expected)
    got = read_aggregates(client, "CWAgent", [(n, listed[(n, d)]) for n, d in expected],
                          t0, t0 + 60)
    assert {k: v[0] for k, v in got.items()} == expected_aggregates(expected)

    def node(cluster: str, **more: str) -> Key:
        return ("node_gpu_utilization",
                frozenset({("ClusterName", cluster), ("NodeName", SAME_NAME), *more.items()}))

    # The same node name in two clusters: two nodes, the idle one idle.
    busy_node = got[node(east, InstanceType="p4d.24xlarge")][0]
    idle_node = got[node("prod-west", InstanceType="p4d.24xlarge")][0]
    assert busy_node["Maximum"] == 100.0 and idle_node["Maximum"] == 0.0
    # Container Insights' node set only where the instance ID is known.
    assert node(east, InstanceId=INSTANCE_ID) in got
    assert not any(dict(d).get("NodeName") == "gpu-node-a" and "InstanceId" in dict(d)
                   for _, d in listed)
    # A cluster's series holds every device of its nodes, and only those.
    cluster_east = got[("node_gpu_utilization", frozenset({("ClusterName", east)}))][0]
    per_node = [got[node(east, InstanceType="p4d.24xlarge")][0],
                got[("node_gpu_utilization", frozenset({
                    ("ClusterName", east), ("NodeName", "gpu-node-a"),
                    ("InstanceType", "p4d.24xlarge")}))][0]]
    assert cluster_east["SampleCount"] == sum(n["SampleCount"] for n in per_node)
    assert cluster_east["Sum"] == sum(n["Sum"] for n in per_node)
    west = got[("node_gpu_utilization", frozenset({("ClusterName", "prod-west")}))][0]
    assert west == idle_node
    # A namespace's series: its pods on both nodes of the cluster.
    ml_east = got[("pod_gpu_utilization",
                   frozenset({("ClusterName", east), ("Namespace", "ml")}))][0]
    assert ml_east["SampleCount"] == 2 * 12 and ml_east["Maximum"] == 100.0
    ml_west = got[("pod_gpu_utilization",
                   frozenset({("ClusterName", "prod-west"), ("Namespace", "ml")}))][0]
    assert ml_west["Maximum"] == 0.0
