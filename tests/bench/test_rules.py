"""``bench/rules.py``: a data set with the ``gpuscope-dashboard`` recording rules recorded,
backfilled by promtool into Prometheus' blocks and replayed by vmalert into VictoriaMetrics.
On a 12-node set, the page started on each result reads the rules (not the raw series) and
finds the planted verdicts; a missing set is one error line, and a tool that fails is named
with its own words."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fleet, rules
from gpuscope.dashboard.data.recorded import RULES
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import page_view
from tests.bench.test_dashboard_bench import REPO
from tests.stores import (
    StoreError,
    backfill_rules,
    replay_chunks,
    replay_rules,
    start_prometheus,
    start_victoriametrics,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("rules") / "set"
    fleet.build(out, 12, step=60.0, log=lambda _: None)
    yield out


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_the_page_reads_the_recorded_rules_and_finds_the_planted_verdicts(
        data: Path, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ruled"
    assert rules.main(["--data", str(data), "--out", str(out), "--store", store]) == 0
    assert "the gpuscope-dashboard rules recorded" in capsys.readouterr().out
    assert not (out / "work").exists()
    meta = fleet.load_meta(out)
    exp = fleet.expected(fleet.plan(meta["nodes"]))
    start = (start_prometheus(out / "tsdb") if store == "prometheus"
             else start_victoriametrics(out / "vm"))
    with start as s:
        source = PrometheusData(s.url, clock=lambda: meta["end"], timeout=60)
        try:
            view = page_view(source, 3600, bundled_prices())
        finally:
            source.close()
    assert view.notes and "recording rules" in view.notes[0]
    k = view.kpis
    assert (k.gpus, k.idle, k.idle_nodes, k.spinning, k.throttled) == (
        exp.gpus, exp.idle_gpus, len(exp.idle_nodes), len(exp.spinning), len(exp.throttled))
    assert {(r.workload, r.node, r.gpu, r.kind) for r in view.straggler_rows} == {
        (wl, node, gpu, kind) for wl, _, node, gpu, kind, _ in exp.stragglers}


def test_a_set_without_the_stores_folder_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "meta.json").write_text('{"start": 0, "end": 60}')
    code = rules.main(["--data", str(tmp_path / "set"), "--out", str(tmp_path / "out"),
                       "--store", "victoriametrics"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("rules: ") and err.count("\n") == 1
    assert "bench/fleet.py --store victoriametrics" in err


def test_a_tool_that_fails_raises_with_its_own_words(tmp_path: Path) -> None:
    (tmp_path / "tsdb").mkdir()
    with pytest.raises(StoreError, match=r"promtool .* exited 1: start time is not before end"):
        backfill_rules(tmp_path / "tsdb", 1000.0, 10.0, tmp_path)


def test_replay_chunks_cover_the_window_once() -> None:
    minute = 60.0
    chunks = replay_chunks(0.0, 2500 * minute, points=1000)
    assert chunks == [(0.0, 999 * minute), (1000 * minute, 1999 * minute),
                      (2000 * minute, 2500 * minute)]
    assert replay_chunks(0.0, 10 * minute, points=1000) == [(0.0, 10 * minute)]
    # Every evaluation in exactly one chunk, none over ``points``.
    times = [t for a, b in chunks for t in range(int(a), int(b) + 1, 60)]
    assert times == list(range(0, 2500 * 60 + 1, 60))


def test_a_replay_in_chunks_records_each_minute_once(data: Path, tmp_path: Path) -> None:
    """A window of several replay runs (20 minutes each here, 1,000 at 5,000 nodes) records
    every minute once: vmalert's own chunks record their boundary minutes twice, and the
    run summaries then trust no finding (``docs/dashboard.md``)."""
    meta = fleet.load_meta(data)
    start, end = meta["start"], meta["end"]
    assert end - start > 40 * 60, "the set must span several 20-minute chunks"
    work = tmp_path / "work"
    work.mkdir()
    with start_victoriametrics(data / "vm") as vm:  # a copy: the set stays as built
        replay_rules(vm, start, end, work, points=20)
        query = urllib.parse.urlencode({
            "query": f"{RULES['util']}[{round(end - start) + 300}s]", "time": f"{end:.3f}"})
        with urllib.request.urlopen(f"{vm.url}/api/v1/query?{query}", timeout=60) as r:
            result = json.load(r)["data"]["result"]
    assert result
    for series in result:
        times = [float(t) for t, _ in series["values"]]
        # From the rule's first minute (its rates need two samples) to the window's end,
        # one sample a minute.
        assert {b - a for a, b in itertools.pairwise(times)} == {60.0}, series["metric"]
        assert times[0] - start <= 180 and times[-1] >= end - 60, (times[0], times[-1])


def test_the_bench_makes_the_findings_begin_within_the_window(tmp_path: Path) -> None:
    """``dashboard_bench --began-within``: the idle, spinning and allocated-idle findings
    begin 40 minutes before the end (their earlier samples removed in the store's copy), so
    the page summarises their runs from a later step, and still finds every planted verdict
    (they need 30 minutes); the set's data is untouched. A value outside the window is one
    error line."""
    data, out = tmp_path / "set", tmp_path / "ruled"
    fleet.build(data, 20, step=60.0, stores=("victoriametrics",), log=lambda _: None)
    assert fleet.expected(fleet.plan(20)).spinning  # 20 nodes: a hung job's among them
    assert rules.main(["--data", str(data), "--out", str(out), "--store", "victoriametrics"]) == 0
    # (Its lock files and caches excepted: every VictoriaMetrics started on a hard-linked
    # copy takes the locks and writes its caches at exit.)
    def files() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in (out / "vm").rglob("*")
                if p.is_file() and p.name != "flock.lock" and "cache" not in p.parts}

    before = files()

    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO / "bench" / "dashboard_bench.py"),
                               "--data", str(out), "--store", "victoriametrics",
                               "--no-browser", "--runs", "1", *args],
                              capture_output=True, text=True, timeout=600)

    run = bench("--began-within", "40")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])["victoriametrics"]
    assert result["began_within_min"] == 40 and result["spinning_nodes_cut"] > 0
    ran = result["summarised"]
    assert ran["idle_from"] == ran["idle"] > 0 and ran["held_idle_from"] == ran["held_idle"] > 0
    assert ran["spinning_from"] == ran["spinning"] > 0, ran
    assert result["verdicts_differ"] == [], result["verdicts_differ"]
    after = files()
    assert before == after, [k for k in after if before.get(k) != after[k]]
    bad = bench("--began-within", "60")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "dashboard_bench: --began-within must be more than 0 and less than the window "
        "(minutes)"]
