from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.model import PartResult, Snapshot
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.prometheus.collectors.exporter import ExporterCollector


class OneShot:
    name = "test"

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def sample(self) -> Snapshot:
        return self.snap

    def close(self) -> None:
        pass


def values(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, s.labels.get("collector", ""))] = s.value
    return out


def test_self_metrics_before_and_after_first_sample() -> None:
    snap = Snapshot(
        timestamp=1234.5, source_up=True,
        parts=(PartResult("nvml_devices", True, 0.25), PartResult("xid", False, 0.0)),
    )
    sampler = Sampler(OneShot(snap), interval=2.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        ExporterCollector(sampler, extra_parts=(lambda: [PartResult("kubelet", False, 1.5)],))
    )
    before = values(registry)
    assert before[("gpu_exporter_nvml_up", "")] == 0.0
    assert ("gpu_exporter_last_sample_timestamp_seconds", "") not in before

    sampler.run_once()
    after = values(registry)
    assert after[("gpu_exporter_nvml_up", "")] == 1.0
    assert after[("gpu_exporter_last_sample_timestamp_seconds", "")] == 1234.5
    assert after[("gpu_exporter_sampling_interval_seconds", "")] == 2.0
    assert after[("gpu_exporter_collector_success", "nvml_devices")] == 1.0
    assert after[("gpu_exporter_collector_duration_seconds", "nvml_devices")] == 0.25
    assert after[("gpu_exporter_collector_success", "xid")] == 0.0
    assert after[("gpu_exporter_collector_success", "kubelet")] == 0.0
    assert after[("gpu_exporter_collector_duration_seconds", "kubelet")] == 1.5


def test_source_down_reports_nvml_up_zero() -> None:
    sampler = Sampler(OneShot(Snapshot(timestamp=1.0, source_up=False)), interval=1.0)
    sampler.run_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(sampler))
    assert values(registry)[("gpu_exporter_nvml_up", "")] == 0.0


def test_errors_total_of_a_round_part_grows_while_it_fails() -> None:
    # A GPU down for three rounds: nvml_devices' success is 0 and its errors counter says
    # 3 (it stayed at 0 while success was 0), then success 1 and the count kept.
    rounds = iter([False, False, False, True])

    class Source:
        name = "nvml"

        def sample(self) -> Snapshot:
            return Snapshot(timestamp=1.0, source_up=True,
                            parts=(PartResult("nvml_devices", next(rounds), 0.001),))

        def close(self) -> None:
            pass

    sampler = Sampler(Source(), interval=1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(sampler))
    seen = []
    for _ in range(4):
        sampler.run_once()
        got = values(registry)
        seen.append((got[("gpu_exporter_collector_success", "nvml_devices")],
                     got[("gpu_exporter_collector_errors_total", "nvml_devices")]))
    assert seen == [(0.0, 1.0), (0.0, 2.0), (0.0, 3.0), (1.0, 3.0)]
