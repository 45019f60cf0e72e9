"""``bench/node_series.py``: node-level series recorded into a copy of a data set, equal to
what the store computes from the raw series; the set itself unchanged; bad input is one
error line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import fleet, node_series
from tests.stores import start_victoriametrics


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("node-series") / "set"
    fleet.build(out, 12, step=60.0, stores=("victoriametrics",), log=lambda _: None)
    return out


def test_node_series_equal_the_raw_aggregates_in_a_copy(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "nodes"
    counts = node_series.record(data, out)
    end = fleet.load_meta(data)["end"]
    with start_victoriametrics(out / "vm", cache=False) as store:
        pairs = {(r["metric"]["node"], r["metric"]["model"]): float(r["value"][1])
                 for r in store.query(node_series.NODE_SERIES["node:gpu_whole:count"], end)}
        recorded = {(r["metric"]["node"], r["metric"]["model"]): float(r["value"][1])
                    for r in store.query("last_over_time(node:gpu_whole:count[2m])", end)}
        assert len(pairs) >= 12 and recorded == pairs
        assert counts["node:gpu_whole:count"] == len(pairs)
        # A minute's mean utilization of every node, over the whole window.
        busy = store.query("count_over_time(node:gpu_busy_ratio:avg1m[1h])", end)
        assert counts["node:gpu_busy_ratio:avg1m"] == len(busy) == 12
        assert all(float(r["value"][1]) >= 59 for r in busy)
    with start_victoriametrics(data / "vm", cache=False) as store:  # the set: as it was
        assert store.query("count(node:gpu_whole:count)", end) == []


def test_bad_input_is_one_line(data: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert node_series.main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("node_series: ") and err.count("\n") == 1
    assert node_series.main(["--data", str(data), "--out", str(data)]) == 2
    err = capsys.readouterr().err
    assert "must not be --data" in err and err.count("\n") == 1
