"""``bench/real_gpu_check.py``'s GPM-cost step (part 5) on the C double of libnvidia-ml, through
the real pynvml: it measures where the double has GPM and reports each GPU as skipped where it
has none (as on a pre-Hopper GPU). The numbers are the double's, not a GPU's: only their shape
is checked here (docs/real-gpu.md has a real GPU's)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import real_gpu_check
from bench.nvml_c_exporter import BuildError, build_library, library_env, load_library
from tests.exporter.sources.fake_nvml import restored_pynvml


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_library(tmp_path_factory.mktemp("fake_libnvml"))
    except BuildError as exc:
        pytest.fail(str(exc))  # not a skip: scripts/setup --test installs gcc


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fewer spaced samples and rounds (each waits over 0.1 s); pynvml's state put back."""
    monkeypatch.setattr(real_gpu_check, "GPM_CALLS", 20)
    monkeypatch.setattr(real_gpu_check, "GPM_SPACED", 2)
    monkeypatch.setattr(real_gpu_check, "GPM_ROUNDS", 3)
    with restored_pynvml():
        yield


def run_step(library: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
             gpm: bool) -> tuple[int, dict[str, object]]:
    for name, value in library_env(2, 1, gpm=gpm).items():
        monkeypatch.setenv(name, value)
    args = argparse.Namespace(library=library, out=out, load=False)
    bad = real_gpu_check.check_gpm_cost(args, real_gpu_check.Shared())
    assert load_library(library).fakeNvmlInitCount() == 0  # every session shut down
    return bad, json.loads((out / "gpm-cost.json").read_text())


def test_timing_in_ms() -> None:
    assert real_gpu_check.timing([]) == {"calls": 0}
    t = real_gpu_check.timing([0.001 * i for i in range(1, 11)])
    assert t == {"calls": 10, "median_ms": 5.5, "p90_ms": 9.1, "min_ms": 1.0, "max_ms": 10.0}
    assert real_gpu_check.timing([0.002])["p90_ms"] == 2.0


@pytest.mark.usefixtures("fast")
def test_gpm_cost_is_measured_per_gpu_and_round(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, result = run_step(library, tmp_path, monkeypatch, gpm=True)
    assert bad == 0
    idle = result["idle"]
    assert isinstance(idle, dict)
    assert "load" not in result
    assert [g["gpu"] for g in idle["gpus"]] == [0, 1]
    for gpu in idle["gpus"]:
        assert gpu["metrics_answered"] == gpu["metrics_asked"] == 9
        assert gpu["sample_get"]["calls"] == gpu["metrics_get"]["calls"] == 20
        assert gpu["sample_get_spaced"]["calls"] == gpu["metrics_get_spaced"]["calls"] == 2
        for what in ("sample_get", "metrics_get"):
            t = gpu[what]
            assert 0 <= t["min_ms"] <= t["median_ms"] <= t["p90_ms"] <= t["max_ms"]
    rounds = idle["round"]
    assert rounds["with_gpm"]["calls"] == rounds["without_gpm"]["calls"] == 3
    assert rounds["devices"] == 2 and rounds["source_up"] and rounds["gpm_series_present"]
    assert rounds["gpm_seconds_counted_by_the_source"]["max_ms"] > 0


@pytest.mark.usefixtures("fast")
def test_a_gpu_without_gpm_is_skipped_not_failed(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, result = run_step(library, tmp_path, monkeypatch, gpm=False)
    assert bad == 0
    idle = result["idle"]
    assert isinstance(idle, dict)
    assert all("no GPM on this GPU" in g["skipped"] for g in idle["gpus"])
    assert len(idle["gpus"]) == 2
    rounds = idle["round"]
    assert not rounds["gpm_series_present"]
    assert rounds["gpm_seconds_counted_by_the_source"]["max_ms"] == 0
