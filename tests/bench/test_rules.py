"""``bench/rules.py``: a data set with the ``gpuscope-dashboard`` recording rules recorded,
backfilled by promtool into Prometheus' blocks and replayed by vmalert into VictoriaMetrics.
On a 12-node set, the page started on each result reads the rules (not the raw series) and
finds the planted verdicts; a missing set is one error line, and a tool that fails is named
with its own words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fleet, rules
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import page_view
from tests.stores import StoreError, backfill_rules, start_prometheus, start_victoriametrics


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
