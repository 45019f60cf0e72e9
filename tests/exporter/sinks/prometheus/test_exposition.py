"""``gpuscope.exporter.sinks.prometheus.exposition.generate_text`` writes exactly the bytes of
prometheus_client's
``generate_latest``: on our registries (fixed snapshot, the full simulated exporter) and on
label values, names and numbers chosen to hit every escaping and formatting rule."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from gpuscope.exporter.cli import build_registry, build_source
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.attribution import Attributor
from gpuscope.exporter.kubernetes.metadata import NodeInfo
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.exposition import CONTENT_TYPE, generate_text
from tests.exporter.snapshots import fixed_snapshot


class Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def registry_of(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def assert_same(registry: Collector) -> bytes:
    expected = generate_latest(registry)
    assert generate_text(registry) == expected
    return expected


def test_content_type_is_text_004() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_empty_registry() -> None:
    assert generate_text(registry_of()) == b""


@pytest.mark.parametrize("process_metrics", [False, True])
def test_fixed_snapshot(process_metrics: bool) -> None:
    snap = fixed_snapshot()
    body = assert_same(
        registry_of(GpuCollector(lambda: snap, process_metrics=process_metrics))
    )
    assert b"gpu_xid_errors_total{" in body


@pytest.mark.parametrize("process_metrics", [False, True])
def test_full_simulated_registry(process_metrics: bool) -> None:
    flags = ["--source", "simulated", *(["--process-metrics"] if process_metrics else [])]
    cfg = parse_config(flags, environ={})
    source, inputs = build_source(cfg)
    attributor = Attributor(inputs, node_fallback=NodeInfo())
    sampler = Sampler(source, cfg.interval, listeners=(attributor,))
    registry = build_registry(cfg, sampler, attributor)
    try:
        assert_same(registry)  # before the first sample: self-metrics only
        for _ in range(3):  # processes come and go between rounds
            sampler.run_once()
            body = assert_same(registry)
            assert b"container_gpu_utilization_ratio{" in body
            assert (b"gpu_process_memory_used_bytes{" in body) is process_metrics
    finally:
        attributor.close()
        source.close()


ADVERSARIAL_VALUES = [
    "",
    "plain",
    'say "hi"',
    "back\\slash",
    "trailing\\",
    "new\nline",
    "\\n is not a newline",
    '\\"',
    "{}",
    "{0} {name}",
    "}{",
    "a,b=c",
    "tab\there",
    "crlf\r\n",
    "ünïcødé ✓ 漢字 🚀",
    "\x00nul",
    " padded ",
]


def adversarial_families() -> list[Metric]:
    g = GaugeMetricFamily("odd_gauge", 'Help with \\ backslash,\nnewline and "quotes".',
                          labels=["zeta", "alpha", "mid"])
    for i, value in enumerate(ADVERSARIAL_VALUES):
        g.add_metric([value, ADVERSARIAL_VALUES[-1 - i], str(i)], float(i))
    one = GaugeMetricFamily("one_label", "One label.", labels=["only"])
    for value in ADVERSARIAL_VALUES:
        one.add_metric([value], 1.0)
    # Label names and metric names that need escaping, and an empty help text.
    dotted = GaugeMetricFamily("dotted.name", "", labels=["b.label", "a-label", "__reserved"])
    dotted.add_metric(["x", "y", "z"], 2.0)
    c = CounterMetricFamily("odd_events", "A counter.", labels=["kind"])
    c.add_metric(["a"], 1.0)
    c.add_metric(["b\n"], 2.0, created=1_700_000_000.25)
    c2 = CounterMetricFamily("already_total", "Named with _total.", value=3)
    numbers = GaugeMetricFamily("numbers", "Every float shape.", labels=["i"])
    for i, v in enumerate(NUMBERS):
        numbers.add_metric([str(i)], v)
    stamped = GaugeMetricFamily("stamped", "With timestamps.", labels=["t"])
    stamped.add_metric(["int"], 1.0, timestamp=1_700_000_000)
    stamped.add_metric(["frac"], 2.0, timestamp=1_700_000_000.123)
    info = InfoMetricFamily("build", "Build info.", labels=["x"])
    info.add_metric(["1"], {"version": 'v"1"', "commit": "abc\\"})
    state = StateSetMetricFamily("state", "A stateset.", labels=["dev"])
    state.add_metric(["d0"], {"on": True, "off": False})
    hist = HistogramMetricFamily("latency_seconds", "A histogram.", labels=["path"])
    hist.add_metric(["/m"], buckets=[("0.1", 1), ("1.0", 5), ("+Inf", 7)], sum_value=3.5)
    ghist = GaugeHistogramMetricFamily("queue", "A gauge histogram.", labels=["q"])
    ghist.add_metric(["a"], buckets=[("1.0", 2), ("+Inf", 3)], gsum_value=4.0)
    summary = SummaryMetricFamily("size_bytes", "A summary.", labels=["s"])
    summary.add_metric(["x"], count_value=4, sum_value=1e7)
    unknown = UnknownMetricFamily("mystery", "Untyped.", value=42)
    no_labels = GaugeMetricFamily("bare", "No labels.", value=-0.0)
    return [g, one, dotted, c, c2, numbers, stamped, info, state, hist, ghist, summary,
            unknown, no_labels]


NUMBERS: list[float] = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 1e-7, -1e-7, 999_999.0, 999_999.999_999_9, 1e6,
    -1e6, 1_000_001.5, 1_234_567.0, 7 * 1024**3, 80 * 1024**3, 123_456_789_012_345.0,
    1e15, 9_999_999_999_999_998.0, 1e16, 1.5e17, 1e300, -1e300, 5e-324, 2**53,
    float("inf"), float("-inf"), float("nan"), 12, True,
]


def test_adversarial_labels_names_and_numbers() -> None:
    body = assert_same(Families(adversarial_families()))
    assert b'say \\"hi\\"' in body and b"new\\nline" in body and b"back\\\\slash" in body
    assert "漢字 🚀".encode() in body


def test_random_label_values() -> None:
    rng = random.Random(20261121)
    alphabet = 'ab"\\\n{}=,é漢 \t0'
    families: list[Metric] = []
    for f in range(20):
        names = rng.sample(["gpu", "uuid", "pod", "namespace", "container", "a", "z"],
                           rng.randint(0, 5))
        fam = GaugeMetricFamily(f"random_{f}", "".join(rng.choices(alphabet, k=12)),
                                labels=names)
        for _ in range(rng.randint(0, 30)):
            fam.add_metric(["".join(rng.choices(alphabet, k=rng.randint(0, 8))) for _ in names],
                           rng.choice([rng.uniform(-1e9, 1e9), rng.random(), 1e12 * rng.random()]))
        families.append(fam)
    assert_same(Families(families))


def test_errors_name_the_family_like_generate_latest() -> None:
    bad = GaugeMetricFamily("bad", "A label value that is not a string.", labels=["n"])
    bad.add_metric([7], 1.0)  # type: ignore[list-item]
    registry = Families([bad])
    with pytest.raises(AttributeError) as expected:
        generate_latest(registry)
    with pytest.raises(AttributeError) as got:
        generate_text(registry)
    assert got.value.args[-1] is bad
    assert type(got.value) is type(expected.value)
