"""``collectors/guard.py``: a collector that raises while rendering loses its own families
for that scrape, counted; the other collectors' families are served. Through the exporter's
own registry (``cli.build_registry``) over the simulated source."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.cli import build_registry, build_source
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.attribution import Attributor, NodeInfo
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.prometheus.collectors import container


def _families(body: bytes) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_a_collector_that_raises_leaves_out_its_families_only(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_config(["--source", "simulated"], environ={})
    source, inputs = build_source(cfg)
    attributor = Attributor(inputs, node_fallback=NodeInfo())
    sampler = Sampler(source, cfg.interval, listeners=(attributor,))
    registry = build_registry(cfg, sampler, attributor)
    try:
        sampler.run_once()
        before = _families(generate_latest(registry))
        assert "container_gpu_utilization_ratio" in before and "gpu_utilization_ratio" in before

        def broken(self: object) -> Iterator[Metric]:
            yield from ()
            raise RuntimeError("a bug in the container collector")

        monkeypatch.setattr(container.ContainerCollector, "collect", broken)
        for scrape in (1, 2):
            got = _families(generate_latest(registry))
            assert "container_gpu_utilization_ratio" not in got
            assert "gpu_utilization_ratio" in got and "gpu_exporter_nvml_up" in got
            errors = {s.labels["collector"]: s.value
                      for s in got["gpu_exporter_render_errors"].samples
                      if s.name.endswith("_total")}
            assert errors == {"container": float(scrape)}
        # Logged once, with its traceback, however many scrapes fail.
        logged = [r for r in caplog.records if "rendering the container metrics" in r.message]
        assert len(logged) == 1 and logged[0].exc_info is not None
        monkeypatch.undo()
        again = _families(generate_latest(registry))
        assert "container_gpu_utilization_ratio" in again
    finally:
        attributor.close()
        source.close()
