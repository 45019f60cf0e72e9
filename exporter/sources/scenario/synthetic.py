"""Programmatic scenarios for benchmarks and tests: a busy node of any size."""

from __future__ import annotations

from gpuscope.exporter.sources.scenario.model import Scenario
from gpuscope.exporter.sources.scenario.parse import scenario_from_dict


def synthetic_scenario(gpus: int, processes_per_gpu: int, seed: int = 0) -> Scenario:
    """:func:`synthetic_document` validated into a :class:`Scenario`."""
    return scenario_from_dict(
        synthetic_document(gpus, processes_per_gpu, seed),
        f"<synthetic {gpus}x{processes_per_gpu}>",
    )


def synthetic_document(gpus: int, processes_per_gpu: int, seed: int = 0) -> dict[str, object]:
    """A busy node with ``gpus`` A100-80GB GPUs and ``processes_per_gpu`` processes on each,
    as the plain mapping a scenario YAML file would give (``yaml.safe_dump`` writes it).

    Processes cycle through every pattern (constant, bursty, stepped, random, sine), every
    fourth one comes and goes, and each GPU is shared by up to four pods through
    time-slicing replicas (a whole-GPU pod when there is one process). Utilizations are
    scaled so that a GPU's processes add up to about 0.9.
    """
    if gpus < 0 or processes_per_gpu < 0:
        raise ValueError("gpus and processes_per_gpu must be >= 0")
    n = processes_per_gpu
    share = 0.9 / n if n else 0.0
    mem = (72 * 2**30 // n) // 2**20 * 2**20 if n else 0
    pods: list[dict[str, object]] = []
    procs: list[dict[str, object]] = []
    for g in range(gpus):
        n_pods = min(4, n)
        for r in range(n_pods):
            pods.append({
                "namespace": "synthetic",
                "name": f"synth-{g}-{r}",
                "workload": f"Deployment/synth-{r}",
                "containers": [{"name": "main",
                                "gpus": [f"{g}::{r}"] if n_pods > 1 else [g]}],
            })
        for i in range(n):
            kind = i % 5
            util: dict[str, object]
            if kind == 0:
                util = {"pattern": "constant", "value": share}
            elif kind == 1:
                util = {"pattern": "bursty", "low": 0.0, "high": min(1.0, 2 * share),
                        "period": 20, "duty": 0.5, "phase": i}
            elif kind == 2:
                util = {"pattern": "stepped", "repeat": 90,
                        "steps": [[0, share * 0.5], [30, share], [60, share * 1.5]]}
            elif kind == 3:
                util = {"pattern": "random", "low": share * 0.5, "high": share * 1.5,
                        "interval": 5, "smooth": i % 2 == 0}
            else:
                util = {"pattern": "sine", "low": 0.0, "high": min(1.0, 2 * share),
                        "period": 300, "phase": 7 * i}
            proc: dict[str, object] = {
                "pid": 10_000 + g * n + i,
                "gpu": g,
                "memory": mem,
                "utilization": util,
                "pod": f"synthetic/synth-{g}-{i % n_pods}/main",
            }
            if i % 4 == 3:
                proc["every"] = {"period": 120, "on": 90}
                proc["start"] = i % 60
            procs.append(proc)
    data: dict[str, object] = {
        "description": f"synthetic: {gpus} GPUs x {n} processes",
        "node": {"name": "synthetic", "instance_type": "p4de.24xlarge", "seed": seed},
        "gpus": [{"count": gpus}] if gpus else [],
        "pods": pods,
        "processes": procs,
    }
    return data
