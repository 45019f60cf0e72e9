"""The demo fleet in-process through embedded scraping and the views: exactly the planted
findings, and only them; plus the service's fallback when the backend fails."""

from __future__ import annotations

import csv
import io
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence

import pytest

from gpuscope.dashboard import components, ids, sections
from gpuscope.dashboard.data import DataError, EmbeddedData, Sample, StepQuery
from gpuscope.dashboard.demo import DemoFleet
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import FleetData, NodeDetail, PodDetail, Series, Window
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.views import FleetView, page_view

IDLE_NODES = {  # type, GPUs, allocated-idle GPUs, spinning GPUs
    "ip-10-0-1-12.ec2.internal": ("p5.48xlarge", 8, 8, 8),   # hung in a collective
    "ip-10-0-2-37.ec2.internal": ("p4d.24xlarge", 8, 2, 0),
    "ip-10-0-4-18.ec2.internal": ("g5.12xlarge", 4, 0, 0),
    "ip-10-0-5-90.ec2.internal": ("g6.xlarge", 1, 1, 0),
}
HUNG = "ip-10-0-1-12.ec2.internal"
MIXED = "ip-10-0-6-20.ec2.internal"
SLICE = 55.04 / 8 * 3 / 7  # a 3g.40gb of one of a p5.48xlarge's 8 H100s


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[DemoFleet, EmbeddedData]]:
    fleet = DemoFleet()
    targets = fleet.start()
    store = EmbeddedData(targets, interval=5.0,
                         extra_metrics=registry.step_metrics())
    fleet.backfill(store)
    store.scrape_once()
    yield fleet, store
    store.close()
    fleet.stop()


@pytest.fixture(scope="module")
def view(demo: tuple[DemoFleet, EmbeddedData]) -> FleetView:
    store = demo[1]
    return page_view(store, 3600, bundled_prices())


def test_the_broken_gpu_is_the_planted_one(view: FleetView) -> None:
    # p5-mixed.yaml: GPU 4's uncorrectable ECC error, XID 63 and pending row remap, 20 min
    # before the demo opens; nothing on any other GPU of the fleet.
    (broken,) = view.findings["gpu-health"]
    assert (broken.ref.node, broken.gpu, broken.pods) == (MIXED, "4", ("hpc/cfd-solver-9xk2p",))
    assert {p.what.split(":")[0].split(" (")[0]: (p.count, p.now) for p in broken.problems} == {
        "XID 63": (1, False),
        # A state until the GPU is reset (as GpuEccUncorrected): it still holds.
        "uncorrectable ECC errors since the GPU's last reset": (1, True),
        "row remap pending": (0, True)}
    assert broken.price_per_hour == 55.04
    assert 19 * 60 < view.window.end - broken.since < 21 * 60
    # The CSV names the pod with its namespace (the page's link shows the pod alone).
    [row] = csv.DictReader(io.StringIO(sections.csv_text(view, "gpu-health-table")))
    assert row["Pods"] == "hpc/cfd-solver-9xk2p"


def test_idle_nodes_are_the_planted_ones(view: FleetView) -> None:
    prices = bundled_prices()
    assert {r.node for r in view.idle_rows} == set(IDLE_NODES)
    for row in view.idle_rows:
        itype, gpus, allocated, spinning = IDLE_NODES[row.node]
        assert (row.instance_type, row.gpus, row.allocated_gpus, row.spinning_gpus) == (
            itype, gpus, allocated, spinning)
        assert row.price_per_hour == prices.per_hour(itype)
        assert row.idle_seconds > 50 * 60  # the demo's hour of past is the evidence
    k = view.kpis
    # The idle nodes (the hung one's whole price among them) and two idle MIG slices.
    assert k.burning_per_hour == pytest.approx(21.957642 + 5.672 + 0.8048 + 55.04 + 2 * SLICE)
    assert k.idle_nodes == 4 and k.idle == 13 and k.spinning == 8 and k.gpus == 66
    assert k.wasted == pytest.approx(k.wasted_allocated + k.wasted_unallocated)
    assert k.wasted_spinning == pytest.approx(55.04, rel=0.01)
    assert k.unpriced_idle_nodes == ()


def test_the_near_miss_is_not_idle(view: FleetView) -> None:
    row = view.heatmap.nodes.index("ip-10-0-5-91.ec2.internal")
    # rate() of the busy counter; scrape times jitter against the sampler's rounds a little.
    assert view.heatmap.z[row][0] == pytest.approx(0.06, rel=2e-3)
    assert view.heatmap.idle[row] == (True,) * 0 + (False,) + (False,) * 7


def test_starved_containers_are_the_planted_ones(view: FleetView) -> None:
    got = {(r.kind, r.namespace, r.pod, r.container, r.gpu) for r in view.starved_rows}
    assert got == {
        ("time-slice", "serving", "rerank-api-6b8c7d9f5-m3n8z", "server", "0"),
        ("input-starved", "vision", "resnet-finetune-8kq2x", "trainer", "1"),
    }
    shares = {r.pod.split("-")[0]: r for r in view.share_rows}
    assert set(shares) == {"chat", "embed", "rerank"}
    assert shares["rerank"].share == pytest.approx(0.03 / 0.94, abs=0.01)
    assert shares["rerank"].fair_share == pytest.approx(1 / 3)


def test_stragglers_are_the_planted_ranks(view: FleetView) -> None:
    # The costliest group first: the 16 GPUs of mixtral-pretrain, then llama-pretrain's 8
    # (two p5.48xlarge at $55.04/hour, one).
    assert [(r.workload, r.pods, r.node, r.gpu, r.kind, r.signal, r.price_per_hour)
            for r in view.straggler_rows] == [
        ("PyTorchJob/mixtral-pretrain", ("mixtral-pretrain-worker-3",),
         "ip-10-0-1-13.ec2.internal", "3", "slow", "sm", pytest.approx(2 * 55.04)),
        ("PyTorchJob/llama-pretrain", ("llama-pretrain-worker-5",),
         "ip-10-0-1-11.ec2.internal", "5", "stalled", "utilization", pytest.approx(55.04)),
    ]
    slow, stalled = view.straggler_rows
    assert 0.3 <= stalled.utilization <= 0.4 and 0.88 <= stalled.median <= 0.96
    # The slow rank works (SM ~0.9) while its 15 peers wait for it (SM ~0.35), and it is
    # thermally throttled half the time, hot and clocked down.
    assert slow.devices == 16
    assert 0.85 <= slow.value <= 0.95 and 0.3 <= slow.median <= 0.4
    e = slow.evidence
    assert e.throttle["thermal"].own == pytest.approx(0.5, abs=0.02)
    assert e.throttle["thermal"].median == 0.0
    assert e.temperature_celsius.own is not None and e.temperature_celsius.median is not None
    assert e.temperature_celsius.own > e.temperature_celsius.median + 20
    assert e.sm_clock_hertz.own is not None and e.sm_clock_hertz.median is not None
    assert e.sm_clock_hertz.own < e.sm_clock_hertz.median
    # llama-pretrain, mixtral-pretrain (16 ranks), gpt-sft, llm-api, llm-decode, cfd-solver
    # and bert-pretrain have two or more GPUs each.
    assert view.workloads_checked == 7
    assert view.default_workload == "ml-train/PyTorchJob/mixtral-pretrain"


def test_spinning_gpus_are_the_hung_node_and_no_near_miss(view: FleetView) -> None:
    assert {(r.node, r.gpu) for r in view.spinning_rows} == {(HUNG, str(i)) for i in range(8)}
    for r in view.spinning_rows:
        assert r.signal == "gpm" and r.utilization > 0.95
        assert r.sm is not None and r.sm < 0.3 and r.tensor == 0.0 and r.dram == 0.0
        assert r.workloads == ("ml-train/PyTorchJob/gpt-sft",)
        assert r.price_per_hour == pytest.approx(55.04 / 8)
    # The near misses on the mixed node are busy and do work: memory-bound decoding (DRAM)
    # and FP32 (SM); the slow rank's waiting peers are busy enough not to count either.
    assert not any(r.node in (MIXED, "ip-10-0-1-13.ec2.internal", "ip-10-0-1-14.ec2.internal")
                   for r in view.spinning_rows)


def test_throttled_gpu_is_the_slow_rank(view: FleetView) -> None:
    assert [(r.node, r.gpu, r.reason, r.pods) for r in view.findings["throttled"]] == [
        ("ip-10-0-1-13.ec2.internal", "3", "thermal", ("ml-train/mixtral-pretrain-worker-3",)),
    ]
    assert view.findings["throttled"][0].ratio == pytest.approx(0.5, abs=0.02)


def test_allocated_idle_containers_on_every_node(view: FleetView) -> None:
    got = {(r.node, r.pod, r.gpu, r.signal): r for r in view.allocated_idle_rows}
    assert set(got) == {
        (MIXED, "notebook-carol", "6/2", "sm"),   # a MIG slice on a busy node (GPM)
        ("ip-10-0-2-37.ec2.internal", "jupyter-dana", "0", "utilization"),
        ("ip-10-0-2-37.ec2.internal", "jupyter-dana", "1", "utilization"),
        ("ip-10-0-5-90.ec2.internal", "dev-erin-0", "0", "utilization"),
    }
    carol = got[(MIXED, "notebook-carol", "6/2", "sm")]
    assert carol.holds == "MIG 3g.40gb (3/7 of GPU 6)"
    assert carol.price_per_hour == pytest.approx(SLICE)
    assert got[("ip-10-0-5-90.ec2.internal", "dev-erin-0", "0", "utilization")
               ].price_per_hour == pytest.approx(0.8048)


def test_the_allocated_idle_note_counts_containers_not_rows(view: FleetView) -> None:
    # jupyter-dana holds two GPUs: two rows, one container.
    _, note, n = sections.table_rows(view, ids.ALLOCATED_IDLE_TABLE, {}, 50)
    assert n == 4 and note.startswith("3 allocated-idle containers, on 4 devices."), note


def test_a_bare_pod_is_said_so(view: FleetView) -> None:
    rows, _, _ = sections.table_rows(view, ids.ALLOCATED_IDLE_TABLE, {}, 50)
    # jupyter-dana and notebook-carol: no controller owns them.
    bare = {str(r["workload"]) for r in rows if "jupyter-dana" in str(r["pod"])
            or "notebook-carol" in str(r["pod"])}
    assert bare == {"(bare pod)"}
    [dev] = [r for r in rows if "dev-erin-0" in str(r["pod"])]
    assert "StatefulSet/dev-erin" in str(dev["workload"])


def test_the_stragglers_csv_writes_numbers(view: FleetView) -> None:
    table = list(csv.DictReader(io.StringIO(sections.csv_text(view, ids.STRAGGLERS_TABLE))))
    by_pod = {r["Pod"]: r for r in table}
    slow = by_pod["mixtral-pretrain-worker-3"]
    assert slow["Compared"].startswith("SM activity")
    assert 0.85 <= float(slow["Value"]) <= 0.95 and 0.3 <= float(slow["Workload median"]) <= 0.4
    # On the page, in %.
    [row] = [r for r in sections.table_rows(view, ids.STRAGGLERS_TABLE, {}, 50)[0]
             if "mixtral" in str(r["workload"])]
    assert str(row["value"]).endswith("%")


def test_a_short_windows_idle_card_says_the_duration_the_tables_use(
        demo: tuple[DemoFleet, EmbeddedData]) -> None:
    short = page_view(demo[1], 900, bundled_prices())
    text = str(components.kpi_cards(short))
    assert "for 15m;" in text and "for 30m" not in text


def test_idle_mig_slices_leave_their_node_busy_and_count_as_waste(view: FleetView) -> None:
    assert {(r.node, r.gpu, r.profile, r.allocated) for r in view.slice_rows} == {
        (MIXED, "6/2", "3g.40gb", True), (MIXED, "7/2", "3g.40gb", False)}
    assert all(r.price_per_hour == pytest.approx(SLICE) for r in view.slice_rows)
    assert MIXED not in {r.node for r in view.idle_rows}


def test_unknown_instance_type_is_listed_without_price(view: FleetView) -> None:
    assert "dgx-a100-01" in view.nodes


def test_workload_view_has_every_rank(demo: tuple[DemoFleet, EmbeddedData]) -> None:
    detail = demo[1].workload_detail("ml-train", "PyTorchJob/mixtral-pretrain", 3600)
    assert len(detail.devices) == 16
    assert {d.ref.node for d in detail.devices} == {"ip-10-0-1-13.ec2.internal",
                                                     "ip-10-0-1-14.ec2.internal"}
    assert set(detail.utilization) == set(detail.sm) == set(detail.power) == {
        d.ref for d in detail.devices}


def test_drill_downs(demo: tuple[DemoFleet, EmbeddedData]) -> None:
    store = demo[1]
    node = store.node_detail("ip-10-0-3-52.ec2.internal", 900)
    assert isinstance(node, NodeDetail)
    assert set(node.utilization) == {"0", "1", "2", "3"}
    # The busy counter's rate per step, as the fleet page's heatmap reads it (its mean).
    shared = node.utilization["0"].values
    assert sum(shared) / len(shared) == pytest.approx(0.94, abs=0.03)
    assert any("rerank-api" in name for name in node.containers)
    hung = store.node_detail(HUNG, 900)
    assert hung.sm["0"].values[-1] == pytest.approx(0.1, abs=0.02)
    assert hung.tensor["0"].values[-1] == 0.0
    assert hung.power_ratio["0"].values[-1] < 0.25
    slow = store.node_detail("ip-10-0-1-13.ec2.internal", 900)
    assert slow.throttle["3 thermal"].values[-1] == pytest.approx(0.5, abs=0.05)
    pod = store.pod_detail("vision", "resnet-finetune-8kq2x", 900)
    assert isinstance(pod, PodDetail)
    [name] = pod.utilization
    assert name == "trainer (ip-10-0-3-52.ec2.internal GPU 1)"
    assert pod.memory_used[name].values[-1] == 18 * 2**30


class Flaky:
    """A DataSource that answers with a fixed FleetData until told to fail."""

    description = "flaky"

    def __init__(self, data: FleetData) -> None:
        self.data = data
        self.fail = False

    def window(self, window_seconds: float) -> Window:
        return self.data.window

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return self.data

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return {q: [] for q in queries}

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        raise DataError("down")

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        raise RuntimeError("bug")

    def close(self) -> None:
        pass


def test_backend_failure_keeps_the_last_data_with_a_banner(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    source = Flaky(demo[1].fleet(3600))
    service = DashboardService(source, bundled_prices(), share_for=0)
    first = service.fleet("1h", None)
    assert first.banner is None and first.view is not None
    source.fail = True
    second = service.fleet("1h", None)
    assert second.view is first.view
    assert second.banner is not None
    assert "unreachable: timed out" in second.banner and "Showing the last data" in second.banner
    # Nothing cached for a brand-new service: a banner and no view, no exception.
    fresh = DashboardService(source, bundled_prices(), share_for=0).fleet("1h", None)
    assert fresh.view is None and fresh.banner and "No data yet" in fresh.banner
    # Drill-downs report problems as text, bugs included.
    assert service.node("n", "1h") == (None, "down")
    # Another window or namespace asked for while the store is down: the last data there
    # is, and the banner says which view that is (the picker says 6h, the page is 1h's).
    other = service.fleet("6h", "ml")
    assert other.view is first.view and other.banner is not None
    assert ("Showing the last data, from " in other.banner
            and "the 1h window, every namespace, not the 6h window, namespace ml"
            in other.banner), other.banner
    assert "not the" not in (service.fleet("1h", None).banner or "")
    detail, problem = service.pod("ns/p", "1h")
    assert detail is None and problem == "Internal error: RuntimeError: bug"


def test_a_cluster_filter_is_a_view_of_its_own_and_a_bad_one_is_ignored(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    service = DashboardService(demo[1], bundled_prices())
    bad = service.fleet("1h", None, '"} or vector(1)')
    assert bad.view is not None and bad.view.cluster is None
    assert bad.banner is not None and bad.banner.startswith(
        "Cluster filter ignored: not a cluster name")
    # The demo's nodes name no cluster: a cluster picked (a link from another dashboard)
    # is an empty page, and kept apart from the whole fleet's.
    other = service.fleet("1h", None, "prod-a")
    assert other.view is not None and other.view.cluster == "prod-a"
    assert other.view.nodes == () and other.view.kpis.gpus == 0
    assert service.latest("1h", None) is not other.view
    assert service.latest("1h", None, "prod-a") is other.view


def test_invalid_namespace_filter_is_ignored_with_a_banner(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    service = DashboardService(demo[1], bundled_prices())
    answer = service.fleet("1h", '"}) or vector(1) or up{x="')
    assert answer.view is not None and answer.banner is not None
    assert answer.banner.startswith("Namespace filter ignored: not a Kubernetes namespace")
    assert len(answer.view.idle_rows) == 4
    narrowed = service.fleet("1h", "vision")
    assert narrowed.banner is None and narrowed.view is not None
    assert [r.pod for r in narrowed.view.starved_rows] == ["resnet-finetune-8kq2x"]


def test_view_caches_stay_bounded_whatever_namespaces_are_typed(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    """Every distinct namespace typed into the filter is a cache key; a dashboard left open
    for weeks must not keep them all. (The demo's data read once: each view is built from
    it, as from a source that answers at once.)"""
    from gpuscope.dashboard.service import MAX_CACHED_VIEWS

    service = DashboardService(Flaky(demo[1].fleet(3600)), bundled_prices(), share_for=0)
    for i in range(MAX_CACHED_VIEWS + 20):
        assert service.fleet("1h", f"team-{i}").view is not None
    assert len(service._last) <= MAX_CACHED_VIEWS
    assert len(service._inflight) <= MAX_CACHED_VIEWS
    # The newest views are the ones kept.
    assert ("1h", f"team-{MAX_CACHED_VIEWS + 19}", None) in service._last
    assert ("1h", "team-0", None) not in service._last


class _SlowStore:
    """What a backfill stores, by node; each scrape stored moves the fleet's clock 50 ms on,
    as filling the demo's past takes its time on a busy machine (here 66 s: 11 nodes x 120
    past scrapes of 10 minutes)."""

    def __init__(self) -> None:
        self.skew = 0.0
        self.times: dict[str, list[float]] = {}

    def clock(self) -> float:
        return time.time() + self.skew

    def ingest(self, node: str, samples: Iterable[Sample], timestamp: float) -> None:
        assert list(samples)
        self.times.setdefault(node, []).append(timestamp)
        self.skew += 0.05


def test_the_past_reaches_the_clock_however_long_filling_it_takes() -> None:
    """The past ends two sampling intervals (1 s each) before the clock at the backfill's
    end, where the live scrapes take over, and no nearer: a gap of the backfill's own
    duration left the 15-minute window (7.5 s steps) with missing steps and no verdict, and
    a past newer than the exporters' latest sample made their counters seem to go back.
    Every node's samples are a step apart, but the last, which closes the gap."""
    store = _SlowStore()
    fleet = DemoFleet(clock=store.clock, history=600.0)
    fleet.start()
    try:
        count = fleet.backfill(store, step=5.0)  # type: ignore[arg-type]
        end = store.clock()
    finally:
        fleet.stop()
    assert store.skew > 30.0  # the backfill took its time
    assert count == sum(len(t) for t in store.times.values())
    assert len(store.times) == len(fleet._paths)
    for times in store.times.values():
        assert 2.0 < end - times[-1] < 3.0  # (the last samples moved the clock 0.55 s)
        assert {round(b - a, 6) for a, b in itertools.pairwise(times[:-1])} == {5.0}
        assert 0 < times[-1] - times[-2] <= 5.0
        assert times[-1] - times[0] > 600.0 - 10.0


def test_every_priced_table_comes_costliest_first(view: FleetView) -> None:
    """The page sends a table's first rows (sections.TOP_ROWS): those that cost the most.
    On the demo fleet, every table with a price lists its rows by it, highest first (an
    unknown price last); the tables that have rows here are checked with at least two."""
    checked = []
    for section in registry.SECTIONS:
        for table in section.tables:
            if not table.order:
                continue
            rows, _, n = sections.table_rows(view, table.id, {}, sections.MAX_ROWS)
            values = [r.get(table.order) for r in rows]
            known = [v for v in values if v is not None]
            assert values == known + [None] * (len(values) - len(known)), table.id
            assert known == sorted(known, key=lambda v: -float(v)), (table.id, known)
            if n >= 2:
                checked.append(table.id)
    # The demo plants idle nodes, spinning and throttled GPUs, allocated-idle and starved
    # containers and stragglers: their tables have rows to order.
    assert {ids.IDLE_NODES_TABLE, ids.ALLOCATED_IDLE_TABLE, ids.SPINNING_GPUS_TABLE,
            ids.STARVED_PODS_TABLE} <= set(checked), checked


@pytest.mark.parametrize("namespace", ["research", "vision"])
def test_the_workload_views_note_does_not_call_a_default_without_straggler_a_stragglers(
    demo: tuple[DemoFleet, EmbeddedData], namespace: str,
) -> None:
    """Filtered to a namespace with no straggler, the workload view opens with its first
    workload: its note says so, not "Showing the first straggler's workload", and counts
    one GPU as one GPU (research: StatefulSet/dev-erin's; vision: Job/resnet-finetune's)."""
    service = DashboardService(demo[1], bundled_prices())
    assert service.fleet("1h", namespace).view is not None
    detail, marks, problem = service.workload(None, "1h", namespace)
    assert detail is not None and problem is None and not marks
    note = components.workload_note(detail, marks, picked=False)
    assert "no straggler" in note and "straggler's workload" not in note, note
    assert note.startswith(f"1 GPU of {namespace}/"), note
    # With a straggler, the default is its workload, and the note says so. (Which one is
    # first is the page's: the demo goes on sampling in real time, and on a loaded machine
    # its two planted stragglers' runs can lapse and come back in another order.)
    view = service.fleet("1h", "ml-train").view
    assert view is not None and view.default_workload
    detail, marks, _ = service.workload(None, "1h", "ml-train")
    assert detail is not None and marks
    note = components.workload_note(detail, marks, picked=False)
    assert view.default_workload in (
        "ml-train/PyTorchJob/mixtral-pretrain", "ml-train/PyTorchJob/llama-pretrain"), (
        view.default_workload)
    assert note.startswith(f"{len(detail.devices)} GPUs of {view.default_workload}; "
                           "straggler ("), note
    assert note.endswith("Showing the first straggler's workload."), note


def test_the_heatmap_hovers_no_gpu_where_a_node_has_none(view: FleetView) -> None:
    """The heatmap's columns are GPU indices 0-7 of the fleet; the one-GPU g6.xlarge's cells
    1-7 are not GPUs of it: their hover says so, and does not call them GPUs that report no
    utilization (as a lost GPU's does)."""
    from gpuscope.dashboard.figures import heatmap_figure

    h = view.heatmap
    hover = heatmap_figure(h).data[0].hovertext
    row = h.nodes.index("ip-10-0-5-90.ec2.internal")
    assert h.columns == tuple(str(i) for i in range(8))
    assert "GPU 0: 0% mean (idle)" in hover[row][0]
    for col in range(1, 8):
        assert "no utilization reported" not in hover[row][col], hover[row][col]
        assert f"no GPU {col} on this node" in hover[row][col], hover[row][col]


def test_a_workload_link_without_its_namespace_is_named_in_the_problem(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    """``?workload=garbage`` (no ``namespace/Kind/name``): the workload view's line names
    what the link gave, not the empty Kind/name left after its namespace ("not a workload
    (Kind/name): ''")."""
    service = DashboardService(demo[1], bundled_prices())
    detail, marks, problem = service.workload("garbage", "1h")
    assert detail is None and not marks
    assert problem is not None and "'garbage'" in problem and "''" not in problem, problem
    # A well-formed one still opens.
    detail, _, problem = service.workload("ml-train/PyTorchJob/llama-pretrain", "1h")
    assert problem is None and detail is not None and len(detail.devices) == 8
