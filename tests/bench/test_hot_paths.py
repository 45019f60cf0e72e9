"""``bench/hot_paths.py`` runs each path for real, briefly: the numbers are the benchmark's
(docs/benchmarks.md); here only that every path is timed over what it says it is."""

from __future__ import annotations

import json

import pytest

from bench import hot_paths


def test_every_path_timed_once_per_round(capsys: pytest.CaptureFixture[str]) -> None:
    assert hot_paths.main(["--rounds", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert set(results) == {"simulated", "processes", "cloudwatch", "kubelet"}
    for r in results.values():
        assert r["calls"] == 3
        assert 0 < r["median_ms"] <= r["p90_ms"]
    # The fake kubelet's answer for 8 GPUs of the benchmark's node, every allocation parsed.
    assert results["kubelet"]["allocations"] == 32


def test_bad_rounds_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        hot_paths.main(["--rounds", "0"])
    assert exit_.value.code == 2
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
