"""MIG slices as units of capacity: each slice's share of its GPU, in Python and in PromQL
(evaluated by promtool), the same for every model."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuscope.dashboard.series import GpuInfo, GpuRef
from gpuscope.dashboard.verdicts.mig import (
    compute_slices_promql,
    slice_share_promql,
    slice_shares,
    slices_per_gpu,
)

# (model as nvmlDeviceGetName gives it, its slices' profiles, their shares of the GPU)
LAYOUTS = [
    ("NVIDIA H100 80GB HBM3", ("3g.40gb", "4g.40gb"), (3 / 7, 4 / 7)),
    ("NVIDIA A30", ("2g.12gb", "1g.6gb"), (2 / 4, 1 / 4)),
    # RTX PRO Blackwell: 4 compute slices (6000) or 2 (5000, 4500), not 7 (MIG user guide,
    # "Supported GPUs"): the one slice of a whole GPU is the whole GPU's price.
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", ("4g.96gb",), (1.0,)),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", ("2g.48gb", "1g.24gb", "1g.24gb"),
     (2 / 4, 1 / 4, 1 / 4)),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", ("1g.24gb",), (1 / 4,)),
    ("NVIDIA RTX PRO 5000 Blackwell", ("1g.24gb", "1g.24gb"), (1 / 2, 1 / 2)),
    ("NVIDIA RTX PRO 4500 Blackwell", ("2g.32gb",), (1.0,)),
]


def _gpus(layouts: list[tuple[str, tuple[str, ...], tuple[float, ...]]]
          ) -> tuple[dict[GpuRef, GpuInfo], dict[GpuRef, float]]:
    gpus: dict[GpuRef, GpuInfo] = {}
    want: dict[GpuRef, float] = {}
    for n, (model, profiles, shares) in enumerate(layouts):
        parent = GpuInfo("node", str(n), f"GPU-{n}", model)
        gpus[parent.ref] = parent
        for i, (profile, share) in enumerate(zip(profiles, shares, strict=True), start=1):
            info = GpuInfo("node", f"{n}/{i}", f"MIG-{n}-{i}", model, parent_uuid=parent.uuid,
                           mig_profile=profile)
            gpus[info.ref] = info
            want[info.ref] = share
    return gpus, want


def test_slices_of_a_whole_gpu_by_model() -> None:
    assert [slices_per_gpu(m) for m in (
        "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA B200", "NVIDIA A30",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "NVIDIA RTX PRO 5000 Blackwell", "NVIDIA RTX PRO 4500 Blackwell",
    )] == [7, 7, 7, 4, 4, 4, 2, 2]


def test_slice_shares_per_model() -> None:
    gpus, want = _gpus(LAYOUTS)
    got = slice_shares(gpus)
    assert set(got) == set(want)
    assert all(math.isclose(got[r], v) for r, v in want.items()), got


def test_slice_shares_in_promql_are_pythons(promtool: str, tmp_path: Path) -> None:
    gpus, want = _gpus(LAYOUTS)
    series = []
    for info in gpus.values():
        labels = (f'node="{info.node}", gpu="{info.gpu}", uuid="{info.uuid}", '
                  f'model="{info.model}", parent_uuid="{info.parent_uuid}", '
                  f'mig_profile="{info.mig_profile}"')
        series.append({"series": f"gpu_info{{{labels}}}", "values": "1x5"})
    expected = [{"labels": f'{{node="{r.node}", uuid="{r.uuid}"}}', "value": v}
                for r, v in want.items()]
    (tmp_path / "none.yaml").write_text("groups: []\n", encoding="utf-8")
    test = {
        "rule_files": ["none.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{
                "expr": slice_share_promql(f"({compute_slices_promql()})"),
                "eval_time": "2m",
                "exp_samples": expected,
            }],
        }],
    }
    path = tmp_path / "mig_test.yaml"
    path.write_text(yaml.safe_dump(test, width=10**6), encoding="utf-8")
    run = subprocess.run([promtool, "test", "rules", path.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("model", ["NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                   "NVIDIA H100 80GB HBM3", "NVIDIA A30"])
def test_a_gpu_carved_whole_is_priced_whole(model: str) -> None:
    whole = {"NVIDIA A30": "4g.24gb", "NVIDIA H100 80GB HBM3": "7g.80gb"}.get(model, "4g.96gb")
    gpus, _ = _gpus([(model, (whole,), (1.0,))])
    assert sum(slice_shares(gpus).values()) == pytest.approx(1.0)
