from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.model import Snapshot, ThrottleTime
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from tests.exporter.snapshots import fixed_snapshot

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu_collector.prom"


def render(snap: Snapshot | None, process_metrics: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: snap, process_metrics=process_metrics))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_exposition_of_fixed_snapshot_matches_fixture() -> None:
    # The fixture was reviewed line by line: lost GPU 1 has only gpu_info and gpu_up 0, the
    # MIG parent and slice have no utilization series, units are base units.
    assert render(fixed_snapshot(), process_metrics=True) == FIXTURE.read_text()


def test_nothing_before_first_sample() -> None:
    assert render(None) == ""


def test_unsupported_and_lost_values_are_absent_not_zero() -> None:
    got = samples(render(fixed_snapshot()))
    lost = frozenset({("gpu", "1"), ("uuid", "GPU-66666666-7777-8888-9999-000000000000")})
    assert got[("gpu_up", lost)] == 0.0
    assert [k for k in got if k[1] == lost] == [("gpu_up", lost)]
    names_for_slice = {
        name for name, labels in got if ("gpu", "2/7") in labels and name != "gpu_info"
    }
    assert "gpu_utilization_ratio" not in names_for_slice
    assert "gpu_memory_used_bytes" in names_for_slice


def test_process_series_are_opt_in() -> None:
    assert "gpu_process_" not in render(fixed_snapshot(), process_metrics=False)
    assert "gpu_process_utilization_ratio" in render(fixed_snapshot(), process_metrics=True)


def test_fresh_families_per_collect_drop_vanished_devices() -> None:
    snap = fixed_snapshot()
    current: list[Snapshot] = [snap]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: current[0]))
    assert "GPU-66666666" in generate_latest(registry).decode()
    current[0] = Snapshot(
        timestamp=snap.timestamp + 1, source_up=True, driver_version=snap.driver_version,
        devices=snap.devices[:1],
    )
    text = generate_latest(registry).decode()
    assert "GPU-66666666" not in text
    assert "MIG-12345678" not in text


def test_work_signals_render_as_counters_and_only_where_given() -> None:
    snap = fixed_snapshot()
    gpu0, lost, parent, mig = snap.devices
    gpu0 = replace(
        gpu0, busy_seconds=12.5, sm_active_seconds=3.25, tensor_active_seconds=0.0,
        sm_occupancy_ratio=0.4, pcie_receive_bytes=1048576.0 * 3,
        throttle_seconds=(ThrottleTime("power", 1.5), ThrottleTime("thermal", 0.0)),
    )
    mig = replace(mig, sm_active_seconds=7.0, dram_active_seconds=2.0)
    text = render(replace(snap, devices=(gpu0, lost, parent, mig)))
    got = samples(text)
    ids0 = {("gpu", "0"), ("uuid", gpu0.uuid)}
    assert got[("gpu_busy_seconds_total", frozenset(ids0))] == 12.5
    assert got[("gpu_sm_active_seconds_total", frozenset(ids0))] == 3.25
    assert got[("gpu_tensor_active_seconds_total", frozenset(ids0))] == 0.0  # given: a real 0
    assert got[("gpu_sm_occupancy_ratio", frozenset(ids0))] == 0.4
    assert got[("gpu_pcie_receive_bytes_total", frozenset(ids0))] == 3 * 1048576
    assert got[("gpu_throttle_seconds_total", frozenset(ids0 | {("reason", "power")}))] == 1.5
    assert got[("gpu_throttle_seconds_total", frozenset(ids0 | {("reason", "thermal")}))] == 0.0
    ids_mig = frozenset({("gpu", "2/7"), ("uuid", mig.uuid)})
    assert got[("gpu_sm_active_seconds_total", ids_mig)] == 7.0
    assert got[("gpu_dram_active_seconds_total", ids_mig)] == 2.0
    # Absent, never 0: what a device does not give has no series.
    for name in ("gpu_dram_active_seconds_total", "gpu_nvlink_receive_bytes_total",
                 "gpu_graphics_active_seconds_total"):
        assert (name, frozenset(ids0)) not in got
    assert not [k for k in got if k[1] == ids_mig and k[0] == "gpu_busy_seconds_total"]
    assert not [k for k in got if k[0] == "gpu_throttle_seconds_total" and ("gpu", "2") in k[1]]
    assert "# TYPE gpu_busy_seconds_total counter" in text
    assert "# TYPE gpu_sm_occupancy_ratio gauge" in text
