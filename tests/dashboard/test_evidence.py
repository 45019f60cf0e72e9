"""The stragglers' evidence is read for the rows the page shows: where the data source reads it
on demand (``FleetData.read_evidence``, the Prometheus-compatible stores), the page asks it of
the nodes of its first ``TOP_ROWS`` rows' groups alone, and of the others' when they are shown
("show all rows", the CSV, a refresh that keeps them shown); each row's evidence is the one
the page computes from every device's evidence at once (the embedded store). On hand-built
data: 80 one-node workloads of 8 GPUs, whose last GPU stalls, each its own temperature."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

import pytest

from gpuscope.dashboard import callbacks, ids, sections
from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import (
    ContainerRef,
    Evidence,
    FleetData,
    GpuInfo,
    GpuRef,
    NodeInfo,
    PodInfo,
)
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.verdicts.stragglers import evidence_text
from gpuscope.dashboard.views import TOP_ROWS, FleetView, build_fleet_view, with_details
from tests.dashboard.conftest import FixedSource, make_series, make_window

WORKLOADS = 80


def node(n: int) -> str:
    return f"node-{n:02d}"


def fleet() -> tuple[FleetData, dict[GpuRef, Evidence]]:
    """The fleet, and every device's evidence (the stalled GPU throttles for heat)."""
    window = make_window(3600.0)
    gpus, nodes, containers, pods, mean, evidence = {}, {}, {}, {}, {}, {}
    for n in range(WORKLOADS):
        name = node(n)
        # Dearer nodes first in the table: two instance types, so its order is not the
        # nodes' names alone.
        nodes[name] = NodeInfo(name, "p4d.24xlarge" if n % 3 else "g5.48xlarge")
        for g in range(8):
            ref = GpuRef(name, f"GPU-{n:02d}-{g}")
            gpus[ref] = GpuInfo(name, str(g), ref.uuid, "A100")
            stalled = g == 7
            util = 0.05 if stalled else 0.8
            mean[ref] = util
            c = ContainerRef(name, "ml", f"train-{n:02d}-{g}", "main", ref.uuid)
            containers[c] = make_series([util] * 61)
            pods[c.pod_key] = PodInfo(name, "ml", c.pod, workload=f"Job/train-{n:02d}")
            evidence[ref] = Evidence({"thermal": 0.5} if stalled else {},
                                     1.2e9 if stalled else 1.8e9, 60.0 + n)
    data = FleetData(window=window, history_start=window.start, gpus=gpus, nodes=nodes,
                     gpu_busy_max={}, gpu_now=dict.fromkeys(gpus, 0.8), gpu_mean=mean,
                     containers=containers, pods=pods, silent=frozenset())
    return data, evidence


class Reader:
    """The store's evidence on demand: each call's nodes are kept; ``fails``: a DataError."""

    def __init__(self, evidence: Mapping[GpuRef, Evidence]) -> None:
        self.evidence = evidence
        self.calls: list[set[str]] = []
        self.fails = False

    def __call__(self, nodes: Collection[str]) -> dict[GpuRef, Evidence]:
        self.calls.append(set(nodes))
        if self.fails:
            raise DataError("the store timed out")
        return {g: e for g, e in self.evidence.items() if g.node in nodes}


@pytest.fixture(scope="module")
def eager() -> FleetView:
    """Every device's evidence at once: the reference."""
    data, evidence = fleet()
    view = build_fleet_view(replace(data, evidence=evidence), bundled_prices())
    assert len(view.straggler_rows) == WORKLOADS > TOP_ROWS
    assert all(r.evidence is not None and r.evidence.throttle for r in view.straggler_rows)
    return view


def lazy() -> tuple[FleetView, Reader]:
    data, evidence = fleet()
    reader = Reader(evidence)
    return build_fleet_view(replace(data, read_evidence=reader), bundled_prices()), reader


def test_the_page_reads_the_evidence_of_the_rows_it_shows(eager: FleetView) -> None:
    view, reader = lazy()
    rows = view.straggler_rows
    # One read, of the first rows' nodes; those rows as the page computes them from every
    # device's evidence; the others unread.
    assert reader.calls == [{r.node for r in rows[:TOP_ROWS]}]
    assert rows[:TOP_ROWS] == eager.straggler_rows[:TOP_ROWS]
    assert all(r.evidence is None for r in rows[TOP_ROWS:])
    shown, _, n = sections.table_rows(view, ids.STRAGGLERS_TABLE, {}, TOP_ROWS)
    assert n == WORKLOADS and [r["evidence"] for r in shown] == [
        evidence_text(r.evidence) for r in eager.straggler_rows[:TOP_ROWS]]
    assert "thermal" in shown[0]["evidence"]

    # The rest, when they are shown: the other rows' nodes alone.
    more, problem = with_details(view, ids.STRAGGLERS_TABLE, sections.MAX_ROWS)
    assert problem is None and more.straggler_rows == eager.straggler_rows
    assert reader.calls[1] == {r.node for r in rows[TOP_ROWS:]}
    # Nothing left to read: no query, the same view.
    assert with_details(more, ids.STRAGGLERS_TABLE, sections.MAX_ROWS) == (more, None)
    assert with_details(view, ids.IDLE_NODES_TABLE, sections.MAX_ROWS) == (view, None)
    assert len(reader.calls) == 2


def test_a_store_that_fails_costs_the_evidence_not_the_page(eager: FleetView) -> None:
    data, evidence = fleet()
    reader = Reader(evidence)
    reader.fails = True
    view = build_fleet_view(replace(data, read_evidence=reader), bundled_prices())
    assert view.straggler_rows == tuple(replace(r, evidence=None)
                                        for r in eager.straggler_rows)
    assert view.kpis == eager.kpis
    assert any("evidence could not be read (the store timed out)" in n for n in view.notes)
    shown, _, _ = sections.table_rows(view, ids.STRAGGLERS_TABLE, {}, TOP_ROWS)
    assert str(shown[0]["evidence"]).startswith("not read")
    # Asked again when the rows are shown, once the store answers.
    reader.fails = False
    more, problem = with_details(view, ids.STRAGGLERS_TABLE, TOP_ROWS)
    assert problem is None and more.straggler_rows[:TOP_ROWS] == \
        eager.straggler_rows[:TOP_ROWS]


class Source(FixedSource):
    """The lazy fleet as a data source (the service's view of a store)."""

    description = "evidence test source"

    def __init__(self) -> None:
        data, evidence = fleet()
        self.reader = Reader(evidence)
        super().__init__(replace(data, read_evidence=self.reader))


def test_show_all_rows_and_the_csv_read_the_rest_once(eager: FleetView) -> None:
    source = Source()
    service = DashboardService(source, bundled_prices())  # type: ignore[arg-type]
    try:
        keys = [callbacks._key(i, p) for i, p in sections.outputs()]
        out = callbacks.fleet_values(service, "1h", None, keys)
        assert len(out[callbacks._key(ids.STRAGGLERS_TABLE, "data")]) == TOP_ROWS
        assert len(source.reader.calls) == 1
        rows, _, limits = callbacks.table_more(service, ids.STRAGGLERS_TABLE, 1, "1h", None,
                                               None)
        assert [r["evidence"] for r in rows] == [evidence_text(r.evidence)
                                                 for r in eager.straggler_rows]
        assert limits == {ids.STRAGGLERS_TABLE: sections.MAX_ROWS}
        assert len(source.reader.calls) == 2
        # The view kept is the one with every row's evidence: the CSV reads nothing more.
        csv = callbacks.table_csv(service, ids.STRAGGLERS_TABLE, 1, "1h", None)
        assert csv["content"].count("thermal") == WORKLOADS
        assert "not read" not in csv["content"] and len(source.reader.calls) == 2
        # A refresh that shares the view (within the service's two seconds): nothing read
        # again, every row's evidence there.
        out = callbacks.fleet_values(service, "1h", None, keys, limits)
        table = out[callbacks._key(ids.STRAGGLERS_TABLE, "data")]
        assert len(table) == WORKLOADS and len(source.reader.calls) == 2
        assert not any("not read" in r["evidence"] for r in table)
        # A refresh with every row asked for (a new computation of the view): the rest read
        # with it.
        service._share_for = 0.0
        out = callbacks.fleet_values(service, "1h", None, keys, limits)
        table = out[callbacks._key(ids.STRAGGLERS_TABLE, "data")]
        assert len(table) == WORKLOADS and not any("not read" in r["evidence"] for r in table)
        assert len(source.reader.calls) == 4
    finally:
        service.close()


def test_the_evidence_says_how_far_back_it_looks_over_a_short_history() -> None:
    """Over 4 minutes of history (a young store, an embedded dashboard just started) the
    stores read the evidence over those 4 minutes (the Prometheus store asks for
    min(D, window, history)): a row said it looked back the 10 minutes of
    ``straggler_duration`` it did not have."""
    data, evidence = fleet()
    young = replace(data, history_start=data.window.end - 240.0)
    for source in (replace(young, evidence=evidence), replace(young,
                                                               read_evidence=Reader(evidence))):
        view = build_fleet_view(source, bundled_prices())
        row = view.straggler_rows[0]
        assert row.evidence is not None and row.evidence.seconds == 240.0
        assert evidence_text(row.evidence).endswith("(last 4m)")
