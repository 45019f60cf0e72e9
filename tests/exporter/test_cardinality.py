"""Cardinality caps: which label sets are kept, what is counted, and a 10,000-process node."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.cardinality import (
    CONTAINER_FAMILY,
    PROCESS_FAMILY,
    DroppedSeries,
    ProcessSeriesCap,
    cap_containers,
    keep_processes,
)
from gpuscope.exporter.kubernetes.attribution import (
    HOST,
    Attribution,
    ContainerKey,
    ContainerUsage,
    PodIdentity,
)
from gpuscope.exporter.model import DeviceSample, ProcessSample, Snapshot
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.scenario import synthetic_document
from tests.conftest import ExporterProcess


def _snapshot(memories: dict[str, list[tuple[int, int]]]) -> Snapshot:
    """Devices by UUID with (pid, memory bytes) processes."""
    return Snapshot(timestamp=1.0, source_up=True, devices=tuple(
        DeviceSample(index=str(i), uuid=uuid, model="m", processes=tuple(
            ProcessSample(pid, ("compute",), mem, 0.1) for pid, mem in procs
        ))
        for i, (uuid, procs) in enumerate(memories.items())
    ))


def test_under_the_cap_keeps_everything_without_a_set() -> None:
    snap = _snapshot({"GPU-a": [(1, 10), (2, 20)], "GPU-b": [(3, 5)]})
    assert keep_processes(snap, 3) == (None, 0)


def test_over_the_cap_keeps_the_biggest_memory_holders() -> None:
    snap = _snapshot({"GPU-a": [(1, 10), (2, 30)], "GPU-b": [(3, 20), (1, 5)]})
    kept, dropped = keep_processes(snap, 2)
    assert kept == {("GPU-a", 2), ("GPU-b", 3)}
    assert dropped == 2


def test_cap_counts_once_per_round_not_per_scrape() -> None:
    snap = _snapshot({"GPU-a": [(pid, pid) for pid in range(1, 11)]})
    dropped = DroppedSeries()
    cap = ProcessSeriesCap(4, dropped)
    collector = GpuCollector(lambda: snap, process_metrics=True, process_cap=cap)
    cap(snap)  # one sampling round
    for _ in range(3):  # three scrapes
        families = {f.name: f for f in collector.collect()}
        memory = families["gpu_process_memory_used_bytes"]
        pids = sorted(int(s.labels["pid"]) for s in memory.samples)
        assert pids == [7, 8, 9, 10]
    assert dropped.totals() == {PROCESS_FAMILY: 6, CONTAINER_FAMILY: 0}
    cap(snap)
    assert dropped.totals()[PROCESS_FAMILY] == 12


def _usage(ns: str, pod: str, uuid: str, allocated: bool, util: float | None,
           memory: int = 0) -> ContainerUsage:
    key = ContainerKey(ns, pod, "main") if pod else HOST
    return ContainerUsage(key, uuid, allocated, util, memory)


def test_container_cap_prefers_allocated_then_memory_and_host_last() -> None:
    rows = (
        _usage("", "", "GPU-a", False, 0.9, 2**34),    # host processes
        _usage("a", "idle-alloc", "GPU-a", True, 0.0),
        _usage("b", "quiet-big-unalloc", "GPU-b", False, 0.1, 2**32),
        _usage("c", "busy-small-unalloc", "GPU-b", False, 0.7, 2**20),
        _usage("d", "alloc", "GPU-c", True, 0.5, 2**30),
    )
    pods = tuple(PodIdentity(u.key.namespace, u.key.pod, "", "") for u in rows if u.key.pod)
    result = Attribution(timestamp=1.0, containers=rows, pods=pods)
    capped, dropped = cap_containers(result, 3)
    assert dropped == 2
    assert [u.key.pod for u in capped.containers] == ["idle-alloc", "quiet-big-unalloc",
                                                      "alloc"]
    assert {p.pod for p in capped.pods} == {"idle-alloc", "quiet-big-unalloc", "alloc"}
    assert cap_containers(result, 5) == (result, 0)


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_a_node_with_ten_thousand_processes_is_capped_and_counted(
    tmp_path: Path, start_exporter: Callable[..., ExporterProcess], promtool: str
) -> None:
    """8 GPUs x 1,250 processes (every fourth one comes and goes) and 32 pods, with
    per-process series on: /metrics stays within the caps and passes promtool, and the drops
    are counted."""
    scenario = tmp_path / "ten-thousand.yaml"
    scenario.write_text(yaml.dump(synthetic_document(8, 1250), Dumper=yaml.CSafeDumper))
    exporter = start_exporter(
        "--source", "simulated", "--scenario", str(scenario), "--interval", "1",
        "--process-metrics", "--max-process-series", "500", "--max-container-series", "20",
    )
    time.sleep(3.5)  # a few rounds
    text = exporter.metrics()
    samples = _families(text)

    assert len(samples["gpu_process_memory_used_bytes"]) == 500
    assert len(samples["gpu_process_utilization_ratio"]) <= 500
    # 32 pods on 8 GPUs, four replicas each: 32 allocated rows + host rows; capped at 20,
    # all of them allocated rows.
    allocated = samples["container_gpu_allocated"]
    assert len(allocated) == 20
    assert len({(lab["namespace"], lab["pod"]) for lab, _ in samples["gpu_pod_info"]}) == 20
    dropped = {lab["family"]: v for lab, v in samples["gpu_exporter_series_dropped_total"]}
    # Each round drops (running processes - 500): at least 7,500 run at any time (every
    # fourth process runs 90 s of every 120 s), and several rounds have passed.
    assert dropped["gpu_process"] >= 2 * 7_000
    assert dropped["container_gpu"] > 0
    # The exporter reports its own rounds. How long a round takes here is the benchmark's
    # (bench/hot_paths.py --only processes, docs/benchmarks.md: about 0.1 s): as a bound in
    # this test it read a missed round with the suite beside two busy loops on 2 cores.
    assert len(samples["gpu_exporter_missed_rounds_total"]) == 1
    sample_parts = {lab["collector"]: v for lab, v in
                    samples["gpu_exporter_collector_duration_seconds"]}
    assert sample_parts["simulated"] > 0, sample_parts

    check = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                           capture_output=True, timeout=60)
    # promtool's lint warns about nothing here; a parse error exits 3.
    assert check.returncode == 0, check.stdout + check.stderr


def test_container_cap_keeps_the_same_rows_while_utilization_moves() -> None:
    """Utilization moves every round (bursty inference, a job between steps): a cap that
    ranked rows by it kept a different set each round, so the dropped pods' series went in
    and out of /metrics every scrape (head churn, gaps in every query over them). The kept
    set follows what moves slowly: allocated rows by name, unallocated rows by memory."""
    def rows(utils: list[float]) -> Attribution:
        allocated = [ContainerUsage(ContainerKey("ns", f"pod-{i}", "main"), f"GPU-{i}", True,
                                    u, 2**30) for i, u in enumerate(utils)]
        unallocated = [ContainerUsage(ContainerKey("ns", f"side-{i}", "main"), "GPU-0", False,
                                      1.0 - u, (i + 1) * 2**20) for i, u in enumerate(utils)]
        containers = tuple(allocated + unallocated)
        pods = tuple(PodIdentity(u.key.namespace, u.key.pod, "", "") for u in containers)
        return Attribution(timestamp=1.0, containers=containers, pods=pods)

    def kept(result: Attribution, limit: int) -> list[str]:
        return sorted(u.key.pod for u in cap_containers(result, limit)[0].containers)

    rounds = [rows([0.9, 0.1, 0.5, 0.0]), rows([0.0, 0.8, 0.2, 0.7]),
              rows([0.3, 0.3, 0.9, 0.1])]
    # Allocated rows over the cap: the same two every round.
    assert {tuple(kept(r, 2)) for r in rounds} == {("pod-0", "pod-1")}
    # All allocated rows and two unallocated ones: the two holding the most memory.
    assert {tuple(kept(r, 6)) for r in rounds} == {
        ("pod-0", "pod-1", "pod-2", "pod-3", "side-2", "side-3")}


def test_container_cap_leaves_the_cloudwatch_rollups_whole() -> None:
    """--max-container-series bounds /metrics only: the attribution the CloudWatch sink
    builds its pod_gpu_* rollups from (Attributor.latest) keeps every row, else a capped
    node's pods lost containers from their sums, or vanished from CloudWatch altogether."""
    from prometheus_client import generate_latest

    from gpuscope.exporter.cli import build_registry, build_source
    from gpuscope.exporter.config import parse_config
    from gpuscope.exporter.kubernetes.attribution import Attributor, NodeInfo
    from gpuscope.exporter.sampler import Sampler

    cfg = parse_config(["--source", "simulated", "--max-container-series", "2"], environ={})
    source, inputs = build_source(cfg)
    dropped = DroppedSeries()
    attributor = Attributor(inputs, node_fallback=NodeInfo(),
                            max_containers=cfg.max_container_series, dropped=dropped)
    sampler = Sampler(source, cfg.interval, listeners=(attributor,))
    registry = build_registry(cfg, sampler, attributor, dropped=dropped)
    try:
        sampler.run_once()
        full = attributor.latest()
        assert full is not None and len(full.containers) > 2
        samples = _families(generate_latest(registry).decode())
        assert len(samples["container_gpu_allocated"]) == 2
        assert dropped.totals()[CONTAINER_FAMILY] == len(full.containers) - 2
    finally:
        attributor.close()
        source.close()


def test_process_cap_keeps_every_gpus_biggest_processes() -> None:
    """Identical workers hold identical memory (one model loaded per process, MPS clients
    under one limit): ranked by memory, then PID, the kept processes were all on the GPU
    with the lowest PIDs and every other GPU had no process series at all. Each device's
    biggest holders come first now, then each one's next, and so on."""
    snap = _snapshot({
        "GPU-a": [(pid, 2**30) for pid in range(100, 110)],
        "GPU-b": [(pid, 2**30) for pid in range(200, 210)],
        "GPU-c": [(300, 2**20), (301, 2**20)],  # one small inference process, and its twin
    })
    kept, dropped = keep_processes(snap, 6)
    assert dropped == 16
    assert kept is not None
    assert sorted(uuid for uuid, _ in kept) == ["GPU-a", "GPU-a", "GPU-b", "GPU-b",
                                                "GPU-c", "GPU-c"]
    # Still the biggest holders within each device, and the same set every round.
    assert keep_processes(snap, 6)[0] == kept
    assert {pid for uuid, pid in kept if uuid == "GPU-a"} == {100, 101}
