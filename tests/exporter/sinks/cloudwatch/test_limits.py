"""PutMetricData limits on a node far bigger than any real one: 8 GPUs x 7 MIG slices, four
pods per slice, 155 distinct values per series in one interval. Checked twice: on the
requests the sink builds, and on the bodies botocore actually sent (through the proxy)."""

from __future__ import annotations

import random
from collections import Counter

from gpuscope.exporter.kubernetes.apiserver import NodeInfo
from gpuscope.exporter.kubernetes.attribution import Attribution, ContainerKey, ContainerUsage
from gpuscope.exporter.model import DeviceSample, Snapshot
from gpuscope.exporter.sinks.cloudwatch import Identity
from gpuscope.exporter.sinks.cloudwatch.aggregate import (
    MAX_VALUES_PER_DATUM,
    Aggregator,
    datums_for,
)
from gpuscope.exporter.sinks.cloudwatch.batching import (
    MAX_DATUMS_PER_REQUEST,
    MAX_DIMENSIONS,
    MAX_REQUEST_BYTES,
    make_batches,
    request_problems,
)
from gpuscope.exporter.sinks.cloudwatch.series import Observer
from tests.exporter.sinks.cloudwatch.helpers import (
    GIB,
    FakeClock,
    minute_start,
    moto_sink,
)
from tests.exporter.sinks.cloudwatch.wire import WireProxy

GPUS, SLICES, PODS_PER_SLICE, ROUNDS = 8, 7, 4, 155
IDENTITY = Identity(host="ip-10-1-2-3.ec2.internal", cluster_name="limits-cluster-" + "x" * 40,
                    instance_id="i-0123456789abcdef0", instance_type="p5.48xlarge")


def mig_node(rng: random.Random, ts: float) -> tuple[Snapshot, Attribution]:
    devices: list[DeviceSample] = []
    usages: list[ContainerUsage] = []
    for g in range(GPUS):
        parent = f"GPU-{g:08d}-aaaa-bbbb-cccc-000000000000"
        devices.append(DeviceSample(
            index=str(g), uuid=parent, model="NVIDIA H100 80GB HBM3", architecture="Hopper",
            memory_used_bytes=rng.randrange(80 * GIB), memory_total_bytes=80 * GIB,
            temperature_celsius=rng.uniform(30, 80), power_watts=rng.uniform(70, 700),
            sm_clock_hertz=rng.uniform(3e8, 2e9), memory_clock_hertz=2.619e9))
        for s in range(SLICES):
            uuid = f"MIG-{g:04d}{s:04d}-aaaa-bbbb-cccc-000000000000"
            devices.append(DeviceSample(
                index=f"{g}/{s + 7}", uuid=uuid, model="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                parent_uuid=parent, mig_profile="1g.10gb", architecture="Hopper",
                utilization_ratio=rng.random(), memory_utilization_ratio=rng.random(),
                memory_used_bytes=rng.randrange(10 * GIB), memory_total_bytes=10 * GIB))
            for p in range(PODS_PER_SLICE):
                usages.append(ContainerUsage(
                    ContainerKey("tenant-" + "n" * 40, f"pod-{g}-{s}-{p}-" + "p" * 40, "main"),
                    uuid, True, rng.random() / PODS_PER_SLICE, rng.randrange(GIB)))
    snap = Snapshot(timestamp=ts, source_up=True, devices=tuple(devices))
    return snap, Attribution(timestamp=ts, containers=tuple(usages),
                             node=NodeInfo(instance_type="p5.48xlarge"))


def rounds(t0: float) -> list[tuple[Snapshot, Attribution]]:
    rng = random.Random(42)
    return [mig_node(rng, t0 + 0.3 * i) for i in range(ROUNDS)]


def test_the_batches_the_sink_builds_respect_every_limit() -> None:
    t0 = minute_start()
    agg = Aggregator(60.0)
    observer = Observer(IDENTITY)
    for snap, attribution in rounds(t0):
        agg.add(snap.timestamp, observer.observe(snap, attribution))
    datums = [d for closed in agg.take_all() for d in datums_for(closed)]
    datums_per_series = Counter(
        (d["MetricName"], tuple((x["Name"], x["Value"]) for x in d["Dimensions"]))
        for d in datums)
    # 155 distinct values per device series: two datums; node_gpu_utilization (56 slices x
    # 155 rounds of distinct values): 58.
    assert datums_per_series[("nvidia_smi_utilization_gpu", (
        ("host", IDENTITY.host), ("index", "0/7"),
        ("name", "NVIDIA H100 80GB HBM3 MIG 1g.10gb"), ("arch", "Hopper")))] == 2
    assert max(datums_per_series.values()) > 50  # node_gpu_utilization: 56 x 155 values
    assert len(datums) > 2 * MAX_DATUMS_PER_REQUEST
    for protocol in ("json", "query"):
        batches = make_batches(datums, "CWAgent", protocol)
        assert [d for b in batches for d in b] == datums
        for batch in batches:
            assert request_problems("CWAgent", batch, protocol) == []
        # Some requests are cut by size, not by count.
        assert any(len(b) < MAX_DATUMS_PER_REQUEST for b in batches[:-1])


def test_the_wire_bodies_respect_every_limit(proxy: WireProxy) -> None:
    # The proxy answers success itself: moto would take seconds to store 170,000 samples
    # (test_moto checks that CloudWatch merges a split series back).
    proxy.plan = lambda req: "accept"
    t0 = minute_start()
    clock = FakeClock(t0)
    played = rounds(t0)
    current: list[Attribution] = []
    sink = moto_sink(clock, proxy.url, identity=IDENTITY,
                     attribution_of=lambda: current[-1] if current else None)
    for snap, attribution in played:
        current.append(attribution)
        sink(snap)
    clock.t = t0 + 63
    sink.tick()

    puts = proxy.put_requests()
    assert all(p.status == 200 for p in puts)
    # 2,978 datums, about 5.1 MB of JSON: six requests, cut by size (botocore >= 1.3x
    # speaks JSON to CloudWatch; the query protocol's longer encoding would take 29). The
    # namespace and cluster rollups of the 224 pods' random values are 4 x 125 to 232 datums.
    assert len(puts) == {"json": 6, "query": 29}[puts[0].protocol]
    records = sink.recent_requests()
    assert len(records) == len(puts) and all(r.ok for r in records)
    per_series: Counter[tuple[str, frozenset[tuple[str, str]]]] = Counter()
    for put, record in zip(puts, records, strict=True):
        assert len(put.datums) == record.datums <= MAX_DATUMS_PER_REQUEST
        assert len(put.body) <= MAX_REQUEST_BYTES
        assert len(put.body) <= record.estimated_bytes + 2048  # the estimate held
        for d in put.datums:
            assert len(d["Dimensions"]) <= MAX_DIMENSIONS
            assert len(d["Values"]) == len(d["Counts"]) <= MAX_VALUES_PER_DATUM
            assert len(set(d["Values"])) == len(d["Values"])
            key = (d["MetricName"], frozenset((x["Name"], x["Value"]) for x in d["Dimensions"]))
            per_series[key] += int(sum(d["Counts"]))
    # Every round of every series arrived: a pod observation per round per slice; the node
    # rollups one per round per slice; the namespace's and the cluster's pod rollups one per
    # round per pod.
    assert set(per_series.values()) == {ROUNDS, ROUNDS * GPUS * SLICES,
                                        ROUNDS * GPUS * SLICES * PODS_PER_SLICE}
    assert per_series[("pod_gpu_utilization",
                       frozenset({("ClusterName", IDENTITY.cluster_name or "")}))] == (
        ROUNDS * GPUS * SLICES * PODS_PER_SLICE)
    assert sink.stats().datums_sent == sum(len(p.datums) for p in puts)
