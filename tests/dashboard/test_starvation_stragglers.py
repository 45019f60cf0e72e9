"""Time-slicing starvation, input starvation and stragglers on hand-built series."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuscope.dashboard.data.recorded import RULE_R, RULE_RR, RULES, Steps
from gpuscope.dashboard.series import ContainerRef, GpuRef, PodInfo, UtilStats
from gpuscope.dashboard.verdicts import Thresholds
from gpuscope.dashboard.verdicts.starvation import input_starved, series_stats, timeslice_shares
from gpuscope.dashboard.verdicts.stragglers import candidate_promql, stragglers
from tests.dashboard.conftest import T0, make_series, make_window
from tests.stores import binary

GPU = GpuRef("node-a", "GPU-0")
HOUR = 3600.0


def c(pod: str, uuid: str = "GPU-0", ns: str = "serving") -> ContainerRef:
    return ContainerRef("node-a", ns, pod, "main", uuid)


def shares(loads: dict[str, list[float]], gpu: list[float], *, window: float = HOUR,
           history: float | None = None):
    w = make_window(window)
    hs = w.start if history is None else T0 - history
    containers = {c(p): make_series(v) for p, v in loads.items()}
    return {v.ref.pod: v for v in timeslice_shares(containers, {GPU: make_series(gpu)}, w, hs)}


def test_container_below_half_its_fair_share_on_a_busy_gpu_is_starved() -> None:
    # Three sharers (fair share 1/3, threshold 1/6): 0.04 of 0.94 is ~4 %.
    v = shares({"chat": [0.55] * 60, "embed": [0.35] * 60, "rerank": [0.04] * 60}, [0.94] * 60)
    assert v["rerank"].starved
    assert v["rerank"].share == pytest.approx(0.04 / 0.94)
    assert v["rerank"].fair_share == pytest.approx(1 / 3)
    assert v["rerank"].starved_seconds == pytest.approx(HOUR)
    assert not v["chat"].starved and not v["embed"].starved


def test_a_026_fair_share_container_among_four_is_not_starved() -> None:
    # Four sharers: fair share 0.25; a container with share 0.26 is fine.
    v = shares({"a": [0.26] * 60, "b": [0.25] * 60, "c": [0.25] * 60, "d": [0.24] * 60},
               [1.0] * 60)
    assert v["a"].share == pytest.approx(0.26)
    assert not any(x.starved for x in v.values())


def test_share_boundary_half_fair_share() -> None:
    # Four sharers: half the fair share is 0.125 of the summed load. Exactly 0.125 is not
    # starved (strictly below is); 0.12 is.
    at = shares({"a": [0.125] * 60, "b": [0.275] * 60, "c": [0.3] * 60, "d": [0.3] * 60},
                [0.95] * 60)
    assert at["a"].share == pytest.approx(0.125)
    assert not at["a"].starved
    below = shares({"a": [0.12] * 60, "b": [0.28] * 60, "c": [0.3] * 60, "d": [0.3] * 60},
                   [0.95] * 60)
    assert below["a"].starved


def test_not_starved_when_the_gpu_is_not_busy() -> None:
    v = shares({"chat": [0.55] * 60, "embed": [0.30] * 60, "rerank": [0.04] * 60}, [0.89] * 60)
    assert not v["rerank"].starved
    assert v["rerank"].starved_seconds == 0


def test_starvation_needs_10_minutes() -> None:
    loads = {"chat": [0.6] * 60, "rerank": [0.3] * 51 + [0.02] * 9}
    v = shares(loads, [0.95] * 60)
    assert not v["rerank"].starved
    assert v["rerank"].starved_seconds == pytest.approx(9 * 60)
    loads = {"chat": [0.6] * 60, "rerank": [0.3] * 50 + [0.02] * 10}
    assert shares(loads, [0.95] * 60)["rerank"].starved


def test_starvation_with_short_history() -> None:
    v = shares({"chat": [0.9] * 3, "rerank": [0.02] * 3}, [0.92] * 3, history=180)
    assert v["rerank"].starved
    assert v["rerank"].required_seconds == pytest.approx(180)


def test_a_single_container_is_not_time_slicing() -> None:
    assert shares({"solo": [0.01] * 60}, [0.95] * 60) == {}


def stats(mean: float, stddev: float, *, samples: int = 100, memory: float = 2**30) -> UtilStats:
    return UtilStats(mean, stddev, samples, memory)


def test_input_starved_is_low_mean_strong_variation_with_memory_held() -> None:
    flagged = input_starved({
        c("loader"): stats(0.32, 0.41),              # bursty: flagged
        c("steady"): stats(0.32, 0.02),              # steady low load: no
        c("busy"): stats(0.6, 0.4),                  # mean >= 0.5: no
        c("idle"): stats(0.05, 0.1),                 # mean not above 0.05: no
        c("nomem"): stats(0.3, 0.4, memory=0),       # holds no memory: no
        c("few"): stats(0.3, 0.4, samples=5),        # too few samples: no
        c("edge"): stats(0.2, 0.1),                  # CV exactly 0.5: flagged
        c("host", ns=""): stats(0.3, 0.4),           # not a container
    })
    assert [f.ref.pod for f in flagged] == ["edge", "loader"]
    assert flagged[1].cv == pytest.approx(0.41 / 0.32)


def test_series_stats_of_a_square_wave() -> None:
    s = series_stats(make_series([0.95] * 3 + [0.05] * 7), memory_bytes=1.0)
    assert s.mean == pytest.approx(0.32)
    assert s.stddev == pytest.approx(0.9 * math.sqrt(0.21))
    assert s.samples == 10


def straggle(loads: dict[str, list[float]], *, window: float = HOUR, workload: str = "PyTorchJob/x",
             history: float | None = None):
    w = make_window(window)
    hs = w.start if history is None else T0 - history
    containers, pods = {}, {}
    for i, (pod, values) in enumerate(loads.items()):
        ref = ContainerRef("node-a", "ml", pod, "pytorch", f"GPU-{i}")
        containers[ref] = make_series(values)
        pods[ref.pod_key] = PodInfo("node-a", "ml", pod, workload)
    return stragglers(containers, pods, w, hs)


def test_straggler_below_half_the_median() -> None:
    report = straggle({"w0": [0.9] * 60, "w1": [0.92] * 60, "w2": [0.91] * 60, "w3": [0.3] * 60})
    assert report.workloads_checked == 1
    [s] = report.stragglers
    assert s.pods == ("w3",)
    assert s.gpu == GpuRef("node-a", "GPU-3")
    assert s.utilization == pytest.approx(0.3)
    assert s.median == pytest.approx(0.905)
    assert s.seconds == pytest.approx(HOUR)


def test_straggler_boundary_at_half_the_median() -> None:
    # Median of (0.8, 0.8, 0.8, 0.4) is 0.8; exactly 0.5 x median is not a straggler.
    assert straggle({"a": [0.8] * 60, "b": [0.8] * 60, "c": [0.8] * 60,
                     "d": [0.4] * 60}).stragglers == ()
    report = straggle({"a": [0.8] * 60, "b": [0.8] * 60, "c": [0.8] * 60, "d": [0.39] * 60})
    assert [s.pods for s in report.stragglers] == [("d",)]


def test_straggler_needs_10_minutes() -> None:
    base = {"a": [0.9] * 60, "b": [0.9] * 60, "c": [0.9] * 60}
    assert straggle({**base, "d": [0.9] * 51 + [0.2] * 9}).stragglers == ()
    assert len(straggle({**base, "d": [0.9] * 50 + [0.2] * 10}).stragglers) == 1


def test_no_straggler_when_the_whole_job_is_idle_or_alone() -> None:
    assert straggle({"a": [0.0] * 60, "b": [0.0] * 60}).stragglers == ()
    report = straggle({"solo": [0.1] * 60})
    assert report.stragglers == () and report.workloads_checked == 0


def test_pods_without_a_workload_are_not_compared() -> None:
    report = straggle({"a": [0.9] * 60, "b": [0.1] * 60}, workload="")
    assert report.stragglers == () and report.workloads_checked == 0


def test_a_slow_rank_candidate_is_judged_per_gpu_model(tmp_path: Path) -> None:
    """The slow-rank rule holds within a workload's GPUs of one model: a workload whose
    A100s are all busy, one doing three times the others' work, beside its own L4s at 30 %,
    is a slow-rank candidate (its busy A100 group is judged), though not every GPU of the
    workload is busy. (``promtool test rules`` over the recorded minutes.)"""
    rec = Steps(RULE_R, RULE_RR, rules=True)
    devices = [("A1", "A100", 0.95, 0.3), ("A2", "A100", 0.95, 0.3),
               ("A3", "A100", 0.95, 0.9), ("L1", "L4", 0.3, 0.2), ("L2", "L4", 0.3, 0.2)]
    series = []
    for i, (uuid, model, util, sm) in enumerate(devices):
        dev = f'node="n1", gpu="{i}", uuid="{uuid}"'
        series += [
            (f'{RULES["workload"]}{{node="n1", uuid="{uuid}", namespace="ml", '
             f'workload="Job/w", model="{model}"}}', f"{util}x10"),
            (f"{RULES['util']}{{{dev}}}", f"{util}x10"),
            (f"{RULES['sm']}{{{dev}}}", f"{sm}x10"),
        ]
    slow = candidate_promql(rec, Thresholds())[1]
    tests = {"rule_files": ["none.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [{
            "expr": slow, "eval_time": "5m",
            "exp_samples": [{"labels": '{namespace="ml", workload="Job/w", kind="slow"}',
                             "value": 1}]}],
    }]}
    (tmp_path / "none.yaml").write_text("groups: []\n")
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests, width=1 << 20))
    run = subprocess.run([binary("promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
