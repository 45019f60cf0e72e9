from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.model import Snapshot
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
