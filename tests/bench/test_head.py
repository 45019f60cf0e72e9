"""``bench/head.py``: a fleet's samples moved through vmagent into an empty Prometheus' head
(remote write, a minute at a time) are all there, none refused, and the dashboard finds in
the head what it finds in the blocks promtool backfilled from the same fleet."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import fleet
from bench.head import LEAD_S, RECEIVER, load_head
from tests.bench import page_view
from tests.stores import Store, fleet_in_both, self_metrics, start_prometheus

ONE_OF_EACH = fleet.layout({t.name: 1 for t in fleet.TEMPLATES})  # 12 nodes


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[fleet.Fleet, Store, Store, dict[str, float]]]:
    tiny = fleet.Fleet(fleet.Shape(len(ONE_OF_EACH), 15.0, 3600.0,
                                   float(int(time.time()) - 120)), ONE_OF_EACH)
    work = tmp_path_factory.mktemp("head")
    with fleet_in_both(tiny, work) as (blocks, vm), \
            start_prometheus(work / "head", copy=False, extra_args=[RECEIVER]) as head:
        figures = load_head(vm, head, tiny.shape.start - LEAD_S, tiny.shape.end,
                            log=lambda _: None)
        yield tiny, blocks, head, figures


def _rounded(value: Any) -> Any:
    """``value`` (a view or part of one) with every float to 9 significant digits:
    VictoriaMetrics, which the samples pass through, keeps a value as a decimal mantissa and
    exponent, so the 13th digit of a mean may differ."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _rounded(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def test_every_sample_is_in_the_head_and_none_was_refused(
        stores: tuple[fleet.Fleet, Store, Store, dict[str, float]]) -> None:
    tiny, _, head, figures = stores
    assert figures["samples"] == tiny.samples
    assert figures["series"] == tiny.series
    m = self_metrics(head.url)
    assert m["prometheus_tsdb_out_of_order_samples_total"] == 0
    assert m["prometheus_tsdb_blocks_loaded"] == 0  # all of it in the head, none persisted
    assert head.series_count(tiny.shape.end) == tiny.series


def test_the_page_reads_the_same_from_the_head_as_from_blocks(
        stores: tuple[fleet.Fleet, Store, Store, dict[str, float]]) -> None:
    tiny, blocks, head, _ = stores
    a, b = page_view(blocks, tiny.shape.end), page_view(head, tiny.shape.end)
    exp = fleet.expected(tiny.plan)
    assert (b.kpis.idle_nodes, b.kpis.idle, b.kpis.spinning, b.kpis.throttled) == (
        len(exp.idle_nodes), exp.idle_gpus, len(exp.spinning), len(exp.throttled))
    assert _rounded(b.findings) == _rounded(a.findings)
    for part in ("kpis", "heatmap", "idle_rows", "spinning_rows",
                 "starved_rows", "straggler_rows", "allocated_idle_rows", "slice_rows",
                 "share_rows"):
        assert _rounded(getattr(b, part)) == _rounded(getattr(a, part)), part


def test_a_data_set_without_meta_is_one_line_and_exit_2(tmp_path: Path) -> None:
    from bench.head import main

    assert main(["--data", str(tmp_path)]) == 2
