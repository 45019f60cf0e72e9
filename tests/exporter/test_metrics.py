"""docs/metrics.md must describe exactly the metrics in exporter/metrics.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuscope.exporter.metrics import METRICS, label_names, new_family

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def doc_rows() -> dict[str, tuple[str, str, tuple[str, ...], str]]:
    """Each table row: type, unit, the labels named in the labels cell, and that cell."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`[a-z_]+`", cells[0]):
            continue
        labels = tuple(re.findall(r"`([a-z_]+)`", cells[3]))
        rows[cells[0].strip("`")] = (cells[1], cells[2], labels, cells[3])
    return rows


def test_docs_table_matches_code_table() -> None:
    documented = doc_rows()
    assert set(documented) == set(METRICS), (
        f"only in docs: {sorted(set(documented) - set(METRICS))}; "
        f"only in code: {sorted(set(METRICS) - set(documented))}"
    )
    for name, spec in METRICS.items():
        optional = tuple(label for label, _ in spec.optional_labels)
        kind, unit, labels, cell = documented[name]
        assert (kind, unit, labels) == (spec.type, spec.unit, spec.labels + optional), name
        # An optional label is documented with its condition, as in the code's table.
        for label, condition in spec.optional_labels:
            assert f"`{label}` only with {condition}" in cell, (name, label)


def test_names_follow_prometheus_conventions() -> None:
    for name, spec in METRICS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
        assert name.endswith("_total") == (spec.type == "counter"), name
        assert "percent" not in name
        every = spec.labels + tuple(label for label, _ in spec.optional_labels)
        assert len(set(every)) == len(every), name
        assert "node" not in every and "hostname" not in every
        assert new_family(name).type == spec.type


def test_only_gpu_node_info_may_carry_the_cluster() -> None:
    # External labels (cluster, replica) are the store's: of every series, only the node's
    # identity may state its cluster, and only when asked to (--cluster-name).
    assert {name for name, spec in METRICS.items()
            if "cluster" in spec.labels + tuple(label for label, _ in spec.optional_labels)
            } == {"gpu_node_info"}
    spec = METRICS["gpu_node_info"]
    assert "cluster" not in spec.labels
    assert label_names(spec) == ("instance_type", "zone", "capacity_type", "node_name")
    assert label_names(spec, ("cluster",)) == (
        "instance_type", "zone", "capacity_type", "node_name", "cluster")
    family = new_family("gpu_node_info", optional=("cluster",))
    family.add_metric(["p5.48xlarge", "us-east-1a", "on-demand", "n1", "prod-east"], 1.0)
    assert family.samples[0].labels["cluster"] == "prod-east"
    with pytest.raises(ValueError, match="no optional label 'cluster'"):
        new_family("gpu_info", optional=("cluster",))
