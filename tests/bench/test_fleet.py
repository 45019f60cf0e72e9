"""``bench/fleet.py``, the large simulated fleet of the scale benchmark and of the store parity
tests: its plan, its samples (the same in both formats, counters monotonic, every node's
names its own), and its expected verdicts, which must be what the dashboard finds on a tiny
fleet with one unit of every template, in a real Prometheus and a real VictoriaMetrics
(``tests/stores.py``) loaded the way the data sets are (promtool blocks, ``/api/v1/import``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import dashboard_bench, fleet
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.verdicts import registry
from tests.bench import page_view
from tests.stores import Store, fleet_in_both, start_prometheus, start_victoriametrics

ONE_OF_EACH = fleet.layout({t.name: 1 for t in fleet.TEMPLATES})  # 12 nodes
P5, P4D, G5, G6 = 55.04, 21.957642, 5.672, 0.8048  # dashboard/prices.yaml, us-east-1


@pytest.mark.parametrize("nodes", [1, 2, 3, 11, 12, 13, 199, 200, 5000])
def test_plan_has_the_nodes_asked_for_and_keeps_two_node_units_whole(nodes: int) -> None:
    plan = fleet.plan(nodes)
    assert len(plan) == nodes
    assert len({n.name for n in plan}) == nodes
    for node in plan:
        t = fleet.template(node.template)
        if node.position > 0:  # the second node of a unit follows its first
            first = plan[node.index - node.position]
            assert (first.template, first.copy, first.unit) == (node.template, node.copy,
                                                                node.unit)
        assert node.unit == node.index - node.position
        assert node.position < t.size


def test_plan_follows_the_shares() -> None:
    got = Counter(n.template for n in fleet.plan(5000))
    total = sum(t.share for t in fleet.TEMPLATES)
    for t in fleet.TEMPLATES:
        assert got[t.name] == pytest.approx(5000 * t.share / total, abs=2)
    # Every 5th copy of a template, and the near-miss g6 node, whose scenario runs on spot.
    spot = Counter(n.template for n in fleet.plan(5000) if n.capacity_type == "spot")
    assert spot.pop("near-miss") == got["near-miss"]
    for name, n in spot.items():
        assert n == got[name] // fleet.template(name).size // fleet.SPOT_EVERY * (
            fleet.template(name).size)


@pytest.mark.parametrize("share", [0.05, 0.15, 0.3, 0.9])
def test_a_flagged_share_puts_the_finding_templates_on_that_share_of_the_nodes(
        share: float) -> None:
    plan = fleet.plan(5000, fleet.flagged_mix(share))
    got = Counter(n.template for n in plan)
    assert len(plan) == 5000
    assert set(got) == {t.name for t in fleet.TEMPLATES}  # every verdict still planted
    assert sum(got[name] for name in fleet.FLAGGED) == pytest.approx(5000 * share, abs=3)
    # Among themselves, the templates keep the default mix's proportions.
    for group in (fleet.FLAGGED, {t.name for t in fleet.TEMPLATES} - fleet.FLAGGED):
        default = {t.name: t.share for t in fleet.TEMPLATES if t.name in group}
        total = sum(got[name] for name in group)
        for name, s in default.items():
            assert got[name] / total == pytest.approx(s / sum(default.values()), abs=0.01)
    flagged = {"straggler", "slow-rank", "mixed", "idle-allocated", "hung", "serving", "idle",
               "dev"}
    assert flagged == fleet.FLAGGED


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, 1.5])
def test_a_flagged_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        fleet.flagged_mix(share)


def _carrying(plan: list[fleet.NodePlan]) -> int:
    """The nodes of ``plan`` whose file plants a finding, by the plants themselves."""
    return sum(1 for n in plan if fleet._has_finding(
        fleet.template(n.template).plants[n.position]))


@pytest.mark.parametrize("share", [0.15, 0.57, 0.87])
def test_a_carrying_share_below_91_percent_keeps_the_default_proportions(share: float) -> None:
    plan = fleet.plan(5000, fleet.carrying_mix(share))
    got = Counter(n.template for n in plan)
    assert _carrying(plan) == pytest.approx(5000 * share, abs=4)
    assert set(got) == {t.name for t in fleet.TEMPLATES}
    flagged = {t.name: t.share for t in fleet.TEMPLATES if t.name in fleet.FLAGGED}
    total = sum(got[name] for name in flagged)
    for name, s in flagged.items():
        assert got[name] / total == pytest.approx(s / sum(flagged.values()), abs=0.01)


def test_a_carrying_share_of_95_percent_has_no_clean_node_and_fewer_slow_rank_jobs() -> None:
    plan = fleet.plan(5000, fleet.carrying_mix(0.95))
    got = Counter(n.template for n in plan)
    assert _carrying(plan) == pytest.approx(4750, abs=4)
    assert set(got) == set(fleet.FLAGGED)  # every finding template, no clean node
    assert got["slow-rank"] == 500  # half of its nodes carry none: 250 of the 5 %
    # The templates whose every node carries one keep their proportions among themselves.
    whole = {t.name: t.share for t in fleet.TEMPLATES
             if t.name in fleet.FLAGGED and t.name != "slow-rank"}
    total = sum(got[name] for name in whole)
    for name, s in whole.items():
        assert got[name] / total == pytest.approx(s / sum(whole.values()), abs=0.01)


@pytest.mark.parametrize("share", [0.0, 1.0, 1.2])
def test_a_carrying_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        fleet.carrying_mix(share)


def test_expected_verdicts_of_one_unit_of_each_template() -> None:
    """By hand from the demo scenarios' comments and prices.yaml: the numbers the demo's
    own test states (tests/dashboard/test_demo_views.py), with the busy template priced as a
    p4d and every node on demand (one copy each: the 5th copy is the first spot one)."""
    exp = fleet.expected(ONE_OF_EACH)
    assert exp.nodes == 12 and exp.gpus == 8 * 8 + 2 * 4 + 2 * 1
    assert {n: (v.gpus, v.allocated_idle, v.spinning) for n, v in exp.idle_nodes.items()} == {
        node: plant for node, plant in _by_template(
            {"idle-allocated": (8, 2, 0), "hung": (8, 8, 8), "idle": (4, 0, 0),
             "dev": (1, 1, 0)}).items()}
    assert exp.idle_gpus == 8 + 4 + 1
    slice_price = P5 / 8 * 3 / 7
    assert exp.idle_per_hour == pytest.approx(P4D + P5 + G5 + G6 + 2 * slice_price)
    assert len(exp.spinning) == 8 and len(exp.throttled) == 1
    assert {s[0] for s in exp.starved} == {"time-slice", "input-starved"}
    first = {n.template: n for n in reversed(ONE_OF_EACH)}
    assert [(s[0], s[2], s[4], s[5]) for s in exp.stragglers] == [
        (f"PyTorchJob/llama-pretrain-{first['straggler'].index:05d}",
         first["straggler"].name, "stalled", "utilization"),
        (f"PyTorchJob/mixtral-pretrain-{first['slow-rank'].index:05d}",
         first["slow-rank"].name, "slow", "sm")]
    assert len(exp.allocated_idle) == 4 and len(exp.idle_slices) == 2
    # busy, straggler, slow-rank, mixed (2), hung, unpriced, serving
    assert exp.workloads_checked == 8
    assert exp.unpriced_idle_nodes == []


def _by_template(values: dict[str, tuple[int, int, int]]) -> dict[str, tuple[int, int, int]]:
    return {n.name: values[n.template] for n in ONE_OF_EACH if n.template in values}


@pytest.fixture(scope="module")
def tiny() -> fleet.Fleet:
    # One unit of each template and a second "mixed" one (the same samples at another phase).
    nodes = fleet.layout({**{t.name: 1 for t in fleet.TEMPLATES}, "mixed": 2})
    return fleet.Fleet(fleet.Shape(len(nodes), 15.0, 1800.0, float(int(time.time()) - 600)),
                       nodes)


def test_both_formats_carry_the_same_samples(tiny: fleet.Fleet) -> None:
    om: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for chunk in tiny.openmetrics():
        for line in chunk.splitlines():
            if line.startswith("#"):
                continue
            head, value, stamp = line.rsplit(" ", 2)
            om.setdefault(_key_of_text(head), []).append((float(stamp), float(value)))
    om_series, om_samples = tiny.series, tiny.samples
    js: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for raw in tiny.vm_json_lines():
        obj = json.loads(raw)
        metric = dict(obj["metric"])
        name = metric.pop("__name__")
        key = (name, ",".join(f'{k}="{v}"' for k, v in sorted(metric.items())))
        js[key] = [(t / 1000, v) for t, v in zip(obj["timestamps"], obj["values"],
                                                   strict=True)]
    assert (tiny.series, tiny.samples) == (om_series, om_samples) == (
        len(om), sum(len(v) for v in om.values()))
    assert om.keys() == js.keys()
    assert om == js  # values round-trip exactly (repr, JSON); times to the millisecond
    stamps = tiny.shape.stamps()
    assert stamps[-1] == tiny.shape.end
    assert stamps[-1] - stamps[0] == tiny.shape.window + fleet.LOOKBACK
    for points in om.values():
        assert {t for t, _ in points} <= {round(s, 3) for s in stamps}


def _key_of_text(head: str) -> tuple[str, str]:
    name, _, labels = head.partition("{")
    return name, labels.rstrip("}")


def test_counters_are_monotonic_and_names_are_each_nodes_own(tiny: fleet.Fleet) -> None:
    uuids: dict[str, str] = {}
    pods: dict[tuple[str, str], set[str]] = {}
    for name, lab, values, ks in tiny.series_of():
        if name.endswith("_total"):
            got = [values[k] for k in ks]
            assert got == sorted(got), (name, lab)
        assert all(not math.isnan(values[k]) for k in ks)
        if lab.get("uuid") and name == "gpu_info":
            assert uuids.setdefault(lab["uuid"], lab["node"]) == lab["node"]
        if name == "gpu_pod_info":
            pods.setdefault((lab["namespace"], lab["pod"]), set()).add(lab["node"])
        if name == "gpu_node_info":
            node = tiny.plan[int(lab["node"].rsplit("-", 1)[1])]
            assert (lab["instance_type"], lab["zone"], lab["capacity_type"]) == (
                node.instance_type, node.zone, node.capacity_type)
    assert len(uuids) == sum(fleet._gpus(fleet.template(n.template).files[n.position])
                             for n in tiny.plan) + 2 * 4  # + the MIG slices of the mixed nodes
    assert all(len(nodes) == 1 for nodes in pods.values())


# -- the dashboard's verdicts on the tiny fleet equal the expected ones, on both stores ---------

@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[fleet.Fleet, list[Store]]]:
    tiny = fleet.Fleet(fleet.Shape(len(ONE_OF_EACH), 15.0, 3600.0,
                                   float(int(time.time()) - 120)), ONE_OF_EACH)
    with fleet_in_both(tiny, tmp_path_factory.mktemp("fleet")) as (prom, vm):
        yield tiny, [prom, vm]


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_the_dashboard_finds_the_expected_verdicts(
    stores: tuple[fleet.Fleet, list[Store]], kind: str
) -> None:
    tiny, started = stores
    [store] = [s for s in started if s.kind == kind]
    assert store.series_count(tiny.shape.end) == tiny.series
    exp = fleet.expected(tiny.plan)
    view = page_view(store, tiny.shape.end)
    k = view.kpis
    assert (k.gpus, k.idle, k.idle_nodes, k.spinning, k.throttled) == (
        exp.gpus, exp.idle_gpus, len(exp.idle_nodes), len(exp.spinning), len(exp.throttled))
    assert k.burning_per_hour == pytest.approx(exp.idle_per_hour)
    assert {(r.node, r.instance_type, r.gpus, r.allocated_gpus, r.spinning_gpus)
            for r in view.idle_rows} == {
        (n, v.instance_type, v.gpus, v.allocated_idle, v.spinning)
        for n, v in exp.idle_nodes.items()}
    assert {(r.node, r.gpu) for r in view.spinning_rows} == set(exp.spinning)
    assert {(r.node, r.gpu, r.reason) for r in view.findings["throttled"]} == set(exp.throttled)
    assert {(r.kind, r.namespace, r.pod, r.container, r.gpu) for r in view.starved_rows} == {
        (kind_, ns, pod, container, gpu) for kind_, ns, pod, container, _, gpu in exp.starved}
    assert {(r.workload, r.pods, r.node, r.gpu, r.kind, r.signal)
            for r in view.straggler_rows} == {
        (wl, (pod,), node, gpu, kind_, signal)
        for wl, pod, node, gpu, kind_, signal in exp.stragglers}
    assert {(r.node, r.pod, r.gpu, r.signal) for r in view.allocated_idle_rows} == {
        (node, pod, gpu, signal) for node, _, pod, gpu, signal in exp.allocated_idle}
    assert {(r.node, r.gpu, r.profile, r.allocated) for r in view.slice_rows} == {
        (node, gpu, profile, allocated) for node, gpu, profile, allocated in exp.idle_slices}
    assert view.workloads_checked == exp.workloads_checked


def test_data_set_folder(tmp_path: Path) -> None:
    meta = fleet.build(tmp_path / "set", 2, step=60.0, window=600.0, log=lambda _: None)
    assert meta["nodes"] == 2 and meta["times"] == 16 and meta["series"] > 0
    assert (tmp_path / "set" / "tsdb").is_dir() and (tmp_path / "set" / "vm").is_dir()
    assert fleet.load_meta(tmp_path / "set") == json.loads(
        (tmp_path / "set" / "meta.json").read_text())
    with start_prometheus(tmp_path / "set" / "tsdb") as prom, \
            start_victoriametrics(tmp_path / "set" / "vm") as vm:
        counts = {s.kind: s.series_count(meta["end"]) for s in (prom, vm)}
    assert counts == {"prometheus": meta["series"], "victoriametrics": meta["series"]}
    assert not any((tmp_path / "set").glob("*.om"))


def test_a_sets_samples_reach_back_past_the_pages_window_wherever_its_step_ends_it(
        tmp_path: Path) -> None:
    """The page's window ends at the last multiple of its step (24 minutes for 24 h), up to
    a step before the set's end: the set's samples still begin before that window (a store
    older than the window), where the page asks whether data reaches back that far."""
    step = 86400.0 / fleet.PAGE_POINTS
    end = (1795604763 // step) * step + step - 1  # the page's window ends a step early
    meta = fleet.build(tmp_path / "set", 2, step=60.0, window=86400.0, end=end,
                       stores=("victoriametrics",), log=lambda _: None)
    with start_victoriametrics(tmp_path / "set" / "vm") as vm:
        store = PrometheusData(vm.url, clock=lambda: end)
        window = store.window(86400.0)
        assert window.step == step and end - window.end == step - 1
        assert meta["start"] <= store._full_history_at(window)
        page = store.fleet(86400.0, window=window)
        store.close()
    assert page.history_start == window.start  # no young-store history


@pytest.mark.parametrize("flagged", ["1.5", "0"])
def test_the_cli_refuses_a_flagged_share_outside_0_1_in_one_line(
        flagged: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--nodes", "10", "--flagged", flagged, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "fleet: --flagged must be between 0 and 1\n"
    assert not any(tmp_path.iterdir())  # nothing built


@pytest.mark.parametrize("args", [["--step", "nan"], ["--window", "nan"], ["--window", "inf"]])
def test_the_cli_refuses_a_step_or_window_that_is_not_a_finite_number_in_one_line(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NaN passed the range check (every comparison with it is false) and ended later in
    "cannot convert float NaN to integer", exit 1, an empty data set's folder left made."""
    out = tmp_path / "set"
    assert fleet.main(["--nodes", "10", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "fleet: --nodes must be >= 1, --step > 0 and --window >= --step\n"
    assert not out.exists()  # nothing built


@pytest.mark.parametrize("args", [["--carrying", "1"], ["--carrying", "0.9", "--flagged", "0.5"]])
def test_the_cli_refuses_a_carrying_share_outside_0_1_or_with_flagged_in_one_line(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--nodes", "10", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "fleet: --carrying must be between 0 and 1, and not with --flagged\n"
    assert not any(tmp_path.iterdir())


def test_block_ranges_counts_the_two_hour_ranges_a_window_reads(tmp_path: Path) -> None:
    boundary = (int(time.time()) // 7200 - 2) * 7200.0  # a block range's start, in the past
    # The 10-minute window inside one range; then across the boundary (5 min each side).
    for end, ranges in ((boundary + 700, 1), (boundary + 300, 2)):
        out = tmp_path / str(ranges)
        meta = fleet.build(out, 2, step=60.0, window=600.0, end=end, stores=("prometheus",),
                           log=lambda _: None)
        window_start = meta["end"] - meta["window"]
        assert fleet.block_ranges(out / "tsdb", window_start, meta["end"]) == ranges
        # The whole set (with its 5 minutes of look-back) starts before the boundary.
        assert fleet.block_ranges(out / "tsdb", meta["start"], meta["end"]) == 2
    assert fleet.block_ranges(tmp_path / "1" / "tsdb", boundary + 7200, boundary + 9000) == 0


# -- a fleet over several clusters (--clusters) ----------------------------------------------

def test_a_two_cluster_set_repeats_node_names_and_keys_its_verdicts_by_cluster(
        tmp_path: Path) -> None:
    """``--clusters 2``: every node name in both clusters (as EKS clusters in default VPCs
    name nodes), the series labelled ``cluster``, and the expected verdicts keyed as the
    dashboard keys nodes (``cluster/node``)."""
    out = tmp_path / "set"
    assert fleet.main(["--nodes", "4", "--clusters", "2", "--step", "60", "--window", "600",
                       "--store", "victoriametrics", "--out", str(out)]) == 0
    meta = fleet.load_meta(out)
    assert (meta["clusters"], meta["cluster_label"]) == (2, "cluster")
    with start_victoriametrics(out / "vm") as vm:
        got = {(s["metric"]["cluster"], s["metric"]["node"])
               for s in vm.query("count by (cluster, node) (gpu_node_info)", meta["end"])}
        assert vm.series_count(meta["end"]) == meta["series"]
    names = {"gpu-node-00000", "gpu-node-00001"}
    assert got == {(c, n) for c in ("eks-00", "eks-01") for n in names}
    exp = json.loads((out / "expected.json").read_text())
    keys = (list(exp["idle_nodes"]) + [s[4] for s in exp["starved"]]
            + [s[2] for s in exp["stragglers"]]
            + [row[0] for k in ("spinning", "throttled", "allocated_idle", "idle_slices")
               for row in exp[k]])
    assert keys and {k.split("/", 1)[0] for k in keys} <= {"eks-00", "eks-01"}
    assert {k.split("/", 1)[1] for k in keys} <= names
    # Without the flag: no cluster label, and verdicts keyed by the bare (unique) names.
    one = fleet.plan(4)
    assert "cluster" not in fleet.node_labels((), one[0])
    assert set(fleet.expected(one).idle_nodes) <= {n.name for n in one}


def test_the_dashboard_keys_a_two_cluster_fleet_as_the_expected_verdicts_do(
        tmp_path: Path) -> None:
    """One unit of each template over two clusters, node names repeating: the page (the
    store's default cluster label) finds the expected verdicts under the same node keys."""
    nodes = fleet.spread(ONE_OF_EACH, 2)
    assert {n.name for n in nodes if n.cluster == "eks-00"} == {
        n.name for n in nodes if n.cluster == "eks-01"}
    assert all(nodes[n.index - n.position].cluster == n.cluster for n in nodes)  # jobs whole
    tiny = fleet.Fleet(fleet.Shape(len(nodes), 15.0, 3600.0, float(int(time.time()) - 120)),
                       nodes)
    exp = fleet.expected(tiny.plan)
    # A third cluster (eks-00's nodes again) whose data reaches the store 200 s late, as
    # through a remote write behind: the page names it, and only it.
    late_nodes = [dataclasses.replace(n, cluster="eks-02") for n in nodes
                  if n.cluster == "eks-00"]
    late = fleet.Fleet(fleet.Shape(len(late_nodes), 15.0, 3600.0, tiny.shape.end - 200),
                       late_nodes)
    # And a fourth whose data stopped 10 minutes before, beyond the store's lookback (its
    # remote write down): no newest sample as of the clock, named from the hour before.
    silent_nodes = [dataclasses.replace(n, cluster="eks-03") for n in late_nodes]
    silent = fleet.Fleet(fleet.Shape(len(silent_nodes), 15.0, 3600.0, tiny.shape.end - 600),
                         silent_nodes)
    with start_victoriametrics() as vm:
        fleet.import_victoriametrics(tiny, vm)
        view = page_view(vm, tiny.shape.end)
        # Where the first page misses findings (CI once read one cluster's alone), the
        # failure says what the store held per cluster and what a second read gave: the
        # store's visibility told from the page's.
        want = (len(exp.idle_nodes), len(exp.spinning), len(exp.throttled))
        seen = ""
        if (view.kpis.idle_nodes, view.kpis.spinning, view.kpis.throttled) != want:
            per_cluster = {r["metric"].get("cluster"): r["value"][1] for r in vm.query(
                "count by (cluster) (last_over_time(gpu_node_info[5m]))", tiny.shape.end)}
            time.sleep(2)
            vm.refresh()
            again = page_view(vm, tiny.shape.end).kpis
            seen = (f"store's nodes per cluster {per_cluster}; read again: "
                    f"{(again.idle_nodes, again.spinning, again.throttled)}")
        vm.import_lines(late.vm_json_lines())
        vm.wait_for_series(tiny.series + late.series, late.shape.end)
        # (Data older than VictoriaMetrics' -search.cacheTimestampOffset, 5 minutes of the
        # wall clock, is kept in its response cache as final: a backfill empties it, as its
        # docs say. The late cluster's last sample is some 320 s old: without it, a page
        # sometimes read the first page's cached answers.)
        vm.refresh()
        later = page_view(vm, tiny.shape.end)
        vm.import_lines(silent.vm_json_lines())
        vm.wait_for_series(tiny.series + late.series + silent.series, silent.shape.end)
        vm.refresh()
        quiet = page_view(vm, tiny.shape.end)
    assert not [n for n in view.notes if "newest exporter sample" in n], view.notes
    (note,) = [n for n in later.notes if "newest exporter sample" in n]
    assert re.match(r"Cluster eks-02 \((2m \d\ds|3m( [0-3]\ds)?) behind\): its newest exporter "
                    r"sample is older than this page's end \(", note), note
    (note,) = [n for n in quiet.notes if "newest exporter sample" in n]
    assert re.match(r"Clusters eks-03 \((9m \d\ds|10m) behind\), eks-02 "
                    r"\((2m \d\ds|3m( [0-3]\ds)?) behind\): their newest exporter samples are "
                    r"older than this page's end \(", note), note
    # (with the page's notes: a read that failed says so there)
    assert (view.kpis.idle_nodes, view.kpis.spinning, view.kpis.throttled) == want, (
        view.notes, seen)
    assert {r.node for r in view.idle_rows} == set(exp.idle_nodes)
    assert all("/" in key for key in exp.idle_nodes)
    assert {(r.node, r.gpu) for r in view.spinning_rows} == set(exp.spinning)
    assert {(r.node, r.gpu, r.reason) for r in view.findings["throttled"]} == set(exp.throttled)
    assert {(r.workload, r.node, r.gpu) for r in view.straggler_rows} == {
        (wl, node, gpu) for wl, _, node, gpu, _, _ in exp.stragglers}
    assert {(r.node, r.pod, r.gpu) for r in view.allocated_idle_rows} == {
        (node, pod, gpu) for node, _, pod, gpu, _ in exp.allocated_idle}
    assert {(r.node, r.gpu, r.profile) for r in view.slice_rows} == {
        (node, gpu, profile) for node, gpu, profile, _ in exp.idle_slices}
    # dashboard_bench.py: the rendering timed part by part, every registered section by id.
    parts = dashboard_bench.section_times(view)
    assert list(parts) == ["heatmap", *(s.id for s in registry.SECTIONS)]
    assert all(t >= 0 for t in parts.values())


def test_dashboard_bench_gives_the_page_a_sets_cluster_label() -> None:
    args = argparse.Namespace(timeout=5.0)
    labelled = dashboard_bench.page_source("http://127.0.0.1:9", {
        "end": 1.0, "cluster_label": "k8s_cluster"}, args)
    plain = dashboard_bench.page_source("http://127.0.0.1:9", {"end": 1.0}, args)
    try:
        assert (labelled.cluster_label, plain.cluster_label) == ("k8s_cluster", "cluster")
    finally:
        labelled.close()
        plain.close()


def test_the_cli_refuses_more_clusters_than_nodes_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--nodes", "2", "--clusters", "3", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "fleet: --clusters must be between 1 and --nodes\n"
    with pytest.raises(ValueError, match="clusters"):
        fleet.spread(ONE_OF_EACH, 0)
