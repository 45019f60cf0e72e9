"""``bench/dashboard_bench.py``'s store settings: ``--store-gogc`` reaches the store's process
(and only a positive target is taken), the store's peak RSS is read beside its RSS, and its
CPU time, garbage collections and allocation, which the bench reports per page; the
showback's figures (its query alone, ``showback()`` timed within the analysis, the owners
adding up to the page's totals) and ``--cluster`` (the page scoped to one cluster, checked
against that cluster's expected verdicts)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from bench import dashboard_bench, fleet
from gpuscope.dashboard import ids
from gpuscope.dashboard.verdicts.owners import OwnerCost
from gpuscope.dashboard.views import FleetView
from tests.stores import cpu_seconds, start_prometheus, start_victoriametrics

REPO = Path(__file__).resolve().parents[2]


def test_a_bad_gc_target_is_one_line_and_exit_2() -> None:
    run = subprocess.run([sys.executable, str(REPO / "bench" / "dashboard_bench.py"),
                          "--store-gogc", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "dashboard_bench: --nodes, --runs and --store-gogc must be >= 1, --step > 0 and "
        "--window >= --step"]
    assert "Traceback" not in run.stdout + run.stderr


def test_the_store_runs_with_the_environment_given_and_reports_its_peak_rss() -> None:
    with start_prometheus(env={"GOGC": "300"}) as prom:
        environ = Path(f"/proc/{prom.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOGC=300" in environ
        assert prom.peak_rss_kib() >= prom.rss_kib() > 0
    with start_prometheus() as prom:  # without: this process' environment as it is
        environ = Path(f"/proc/{prom.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOGC=300" not in environ


def test_the_stores_cpu_time_collections_and_allocation_are_read_from_the_store() -> None:
    """What the bench reports per page: the store's CPU seconds (``/proc``), completed
    garbage collections and bytes allocated (its ``/metrics``); all grow with the work asked
    of it, on both stores."""
    for start in (start_prometheus, start_victoriametrics):
        with start() as store:
            cpu, go = store.cpu_seconds(), store.go_counters()
            assert cpu >= 0 and go.collections is not None and go.collections >= 0
            assert go.allocated_bytes is not None and go.allocated_bytes > 0
            deadline = time.monotonic() + 30
            # Queries until the store has both spent CPU and collected (a Go program
            # collects at least every 2 minutes; these queries allocate and make it sooner).
            while time.monotonic() < deadline:
                store.query('count({__name__=~".+"})')
                store.query("sum(rate(process_cpu_seconds_total[5m]))")
                now = store.go_counters()
                if store.cpu_seconds() > cpu and (now.collections or 0) > go.collections:
                    break
            now = store.go_counters()
            assert store.cpu_seconds() > cpu
            assert (now.collections or 0) > go.collections
            assert (now.allocated_bytes or 0) > go.allocated_bytes


def test_cpu_seconds_reads_a_process_whose_name_holds_spaces(tmp_path: Path) -> None:
    script = tmp_path / "a name with spaces"
    script.write_text("#!/bin/sh\nwhile :; do :; done\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script)])
    try:
        # The busy loop's CPU time grows, read through the spaces in /proc/PID/stat's name.
        # Polled, not slept for: on a loaded host it got 0.1 s of CPU in 0.5 s (CI, stop 28).
        first = cpu_seconds(proc.pid)
        deadline = time.monotonic() + 60
        while (now := cpu_seconds(proc.pid)) < first + 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first + 0.2 <= now < 120
    finally:
        proc.kill()
        proc.wait()


# -- the showback's figures and the cluster picker (issue 30) ---------------------------------

def _view(owners: list[OwnerCost], spent: float, wasted: float, spinning: float) -> FleetView:
    """What :func:`dashboard_bench.showback_totals` reads of a view: its owners and KPIs."""
    kpis = SimpleNamespace(spent=spent, wasted=wasted, wasted_spinning=spinning)
    return cast(FleetView, SimpleNamespace(owners=tuple(owners), kpis=kpis))


def test_showback_totals_add_up_to_the_cent_or_name_what_does_not() -> None:
    owners = [OwnerCost("eks-00", "research-0", "Job/a", spent=0.1, idle=0.2, spinning=0.05),
              OwnerCost("eks-00", "(unallocated)", "", spent=0.2, idle=0.1),
              OwnerCost("eks-01", "research-0", "Job/a", spent=100.0, idle=0.0)]
    # 0.1 + 0.2 is not 0.3 in floats: within half a cent is adding up.
    got = dashboard_bench.showback_totals(_view(owners, 100.3, 0.3, 0.05))
    assert got["differ"] == [] and got["owners"] == 3
    assert got["spent"]["owners"] == got["spent"]["kpi"] == 100.3
    assert abs(got["idle"]["difference"]) < 1e-12
    # A cent off is not.
    off = dashboard_bench.showback_totals(_view(owners, 100.31, 0.3, 0.06))
    assert off["differ"] == ["spent", "spinning"]
    assert off["spent"]["difference"] == pytest.approx(-0.01)


def test_timing_times_every_call_and_puts_the_function_back() -> None:
    module = SimpleNamespace(f=lambda x: x * 2)
    original = module.f
    seconds: list[float] = []
    with dashboard_bench.timing(module, "f", seconds):
        assert module.f(21) == 42 and module.f(1) == 2
        with pytest.raises(TypeError):
            module.f()  # a call that raises is timed too
    assert len(seconds) == 3 and all(s >= 0 for s in seconds)
    assert module.f is original


def test_cluster_expected_is_the_clusters_share_of_the_sets_verdicts() -> None:
    """The plan made again from meta.json, cluster by cluster: the clusters' expected
    verdicts add up to the whole set's (``bench/fleet.py``'s)."""
    meta = {"nodes": 200, "flagged": 0.5, "clusters": 4}
    whole = fleet.expected(fleet.spread(fleet.plan(200, fleet.flagged_mix(0.5)), 4)).to_json()
    parts = [dashboard_bench.cluster_expected(meta, fleet.cluster_name(k)) for k in range(4)]
    assert sum(p["nodes"] for p in parts) == 200
    for key in ("idle_nodes", "spinning", "throttled", "starved", "stragglers",
                "allocated_idle", "idle_slices"):
        assert sum(len(p[key]) for p in parts) == len(whole[key]), key
    assert sum(p["idle_gpus"] for p in parts) == whole["idle_gpus"]
    assert sum(p["idle_per_hour"] for p in parts) == pytest.approx(whole["idle_per_hour"])
    assert all(k.startswith("eks-02/") for k in parts[2]["idle_nodes"])
    with pytest.raises(ValueError, match="no cluster 'eks-09'"):
        dashboard_bench.cluster_expected(meta, "eks-09")


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40-node set over two clusters (half the nodes with a finding), VictoriaMetrics
    alone, without the recording rules."""
    out = tmp_path_factory.mktemp("bench") / "set"
    fleet.build(out, 40, step=60.0, window=3600.0, stores=("victoriametrics",), flagged=0.5,
                clusters=2, log=lambda _: None)
    return out


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "dashboard_bench.py"),
                           "--store", "victoriametrics", "--no-browser", "--runs", "1",
                           *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cluster", [None, "eks-01"])
def test_the_bench_times_the_showback_and_checks_its_totals(
        two_clusters: Path, cluster: str | None) -> None:
    """The whole page and one cluster's: the verdicts as planted (the cluster's share of
    them), the owners adding up to the page's totals, the showback's own figures."""
    run = _bench("--data", str(two_clusters), *(["--cluster", cluster] if cluster else []))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])["victoriametrics"]
    assert result["verdicts_differ"] == []
    assert result["showback_totals"]["differ"] == []
    assert result["showback_totals"]["owners"] > 0 and result["showback_s"] > 0
    assert result["holdings_rows"] > 0 and result["holdings_query_s"] > 0
    assert result["holdings_from_rules"] is False
    assert "cost-by-owner" in result["render_parts_s"]  # its section's id
    # What the page received, by role, adds up to what it received in all.
    roles = result["received_by_role"]
    assert {"now", "pods", "holdings", dashboard_bench.OTHER_ROLE} <= set(roles)
    assert sum(v["series"] for v in roles.values()) == result["received_series"]
    assert sum(v["mib"] for v in roles.values()) == pytest.approx(
        result["received_mib"], abs=0.05 + 0.01 * len(roles))
    assert "received by role" in run.stdout
    # The dashboard's own CPU a page: some while it fetches (decoding the answers) and
    # while it analyses, never more than the two cores' time the page took.
    cpu = result["python_cpu_s"]
    assert cpu["fetch"] > 0 and 0 < cpu["analysis"] <= 2 * max(result["page_s"]) + 0.1
    assert "CPU-s fetching" in run.stdout
    assert result.get("cluster") == cluster
    if cluster:
        exp = dashboard_bench.cluster_expected(fleet.load_meta(two_clusters), cluster)
        assert result["verdicts"]["idle_nodes"] == len(exp["idle_nodes"]) > 0
    assert "add up to the cent" in run.stdout


def test_role_counts_are_a_pages_answers_by_role_most_bytes_first() -> None:
    before = {"now": [100, 4, 2], "pods": [50, 5, 1]}
    after = {"now": [160, 7, 3], "pods": [50, 5, 1], "gpus": [900, 30, 2], "": [20, 1, 1]}
    assert list(dashboard_bench.role_counts(before, after).items()) == [
        ("gpus", [900, 30, 2]), ("now", [60, 3, 1]), (dashboard_bench.OTHER_ROLE, [20, 1, 1])]


def test_an_unknown_cluster_is_one_line_and_exit_2(two_clusters: Path) -> None:
    run = _bench("--data", str(two_clusters), "--cluster", "eks-07")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "dashboard_bench: --cluster: the data set has no cluster 'eks-07': its clusters are "
        "['eks-00', 'eks-01']"]
    assert "Traceback" not in run.stdout + run.stderr


def test_the_browser_load_opens_the_sets_window_and_cluster() -> None:
    # The server-side pages read the set's window: the browser load must open the same view,
    # not the default hour (a 6-hour set's load timed the 1-hour page before).
    assert dashboard_bench.load_query(3600.0, None) == ""
    assert dashboard_bench.load_query(21600.0, None) == "?window=6h"
    assert dashboard_bench.load_query(86400.0, "eks-03") == "?window=24h&cluster=eks-03"
    assert dashboard_bench.load_query(3600.0, "eks-03") == "?cluster=eks-03"
    assert dashboard_bench.load_query(3600.0, None, "research-0") == "?namespace=research-0"
    with pytest.raises(SystemExit, match="no 7200-s window"):
        dashboard_bench.load_query(7200.0, None)


def test_a_loads_fleet_answer_is_the_fleet_callbacks_own() -> None:
    """The browser load reports when the fleet callback's answer was in (and its size): the
    request whose body names the ``fleet-kpis`` output, not the other callbacks' (the URL's,
    the drill-downs', the workload view's, which may come later and be larger)."""
    fleet_body = json.dumps({"output": "..fleet-kpis.children...history-note.children..",
                             "inputs": []})
    finished = [
        (json.dumps({"output": "..page-url.search...window-select.value.."}), 1000.2, 28),
        (fleet_body, 1002.5, 295_000),
        (json.dumps({"output": "..workload-view.figure...workload-note.children..",
                     "inputs": [{"id": "choices", "property": "data"}]}), 1003.1, 150_000),
    ]
    answer, size = dashboard_bench.fleet_answer(finished, 1000.0)
    assert answer == pytest.approx(2.5) and size == 295_000
    # A refresh within the load: the last answer.
    answer, size = dashboard_bench.fleet_answer([*finished, (fleet_body, 1004.0, 300_000)],
                                                1000.0)
    assert answer == pytest.approx(4.0) and size == 300_000
    assert dashboard_bench.fleet_answer(finished[:1], 1000.0) == (None, None)
    load = dashboard_bench.BrowserLoad(3.4, 2.5, 295_000)
    assert load.total - (load.answer or 0.0) == pytest.approx(0.9)


def test_a_drawn_page_is_timed_in_the_page_on_what_the_bench_waits_for() -> None:
    """The page is drawn when the idle-node table has rows, the heatmap is drawn, and the
    stragglers' and showback's tables have rows (a namespace's page: their notes written,
    its tables may rightly be empty); the page itself times that moment (the driver's waits
    return later where the page's thread is busy), with the same conditions."""
    plain = dashboard_bench.drawn_conditions(False)
    assert ("#idle-nodes-table td.dash-cell", False) in plain
    assert ("#fleet-heatmap .heatmaplayer", False) in plain
    assert {f"#{t} td.dash-cell" for t in (ids.STRAGGLERS_TABLE, *dashboard_bench.COST_TABLES)
            } <= {sel for sel, _ in plain}
    filtered = dashboard_bench.drawn_conditions(True)
    assert (f"#{ids.STRAGGLERS_NOTE}", True) in filtered
    assert not any(sel.endswith("td.dash-cell") and "idle-nodes" not in sel
                   for sel, _ in filtered)
    script = dashboard_bench.drawn_script(plain)
    assert json.dumps(plain) in script and "window.__gpuscopeDrawn" in script
    load = dashboard_bench.BrowserLoad(2.3, 2.1, 295_000, 2.7)
    assert load.driver is not None and load.driver > load.total


def test_the_page_load_is_timed_in_chromium(two_clusters: Path) -> None:
    """The browser part on a real Chromium: the page drawn (timed in the page) after the
    fleet's answer came in and no later than Playwright saw it; each load's figures in the
    result, with the CPU it took of Chromium's processes, of the dashboard's and (the page
    computed on demand) of the store's."""
    run = subprocess.run([sys.executable, str(REPO / "bench" / "dashboard_bench.py"),
                          "--store", "victoriametrics", "--runs", "1", "--data",
                          str(two_clusters)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])["victoriametrics"]
    for mode in ("on_demand", "kept_warm"):
        drawn, driver = result[f"page_load_{mode}_s"], result[f"page_load_{mode}_driver_s"]
        answer = result[f"page_load_{mode}_answer_s"]
        assert 0 < answer <= drawn <= driver + 0.05, (mode, answer, drawn, driver)
        # Chromium draws the page and the dashboard answers it: both spend CPU on a load
        # (0 would mean their processes were not found).
        assert result[f"page_load_{mode}_chromium_cpu_s"] > 0, result
        assert result[f"page_load_{mode}_own_cpu_s"] > 0, result
    assert result["page_load_on_demand_store_cpu_s"] > 0, result
