"""docs/metrics.md must describe exactly the metrics in exporter/metrics.py."""

from __future__ import annotations

import re
from pathlib import Path

from gpuscope.exporter.metrics import METRICS, new_family

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def doc_rows() -> dict[str, tuple[str, str, tuple[str, ...]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`[a-z_]+`", cells[0]):
            continue
        labels = tuple(re.findall(r"`([a-z_]+)`", cells[3]))
        rows[cells[0].strip("`")] = (cells[1], cells[2], labels)
    return rows


def test_docs_table_matches_code_table() -> None:
    documented = doc_rows()
    assert set(documented) == set(METRICS), (
        f"only in docs: {sorted(set(documented) - set(METRICS))}; "
        f"only in code: {sorted(set(METRICS) - set(documented))}"
    )
    for name, spec in METRICS.items():
        assert documented[name] == (spec.type, spec.unit, spec.labels), name


def test_names_follow_prometheus_conventions() -> None:
    for name, spec in METRICS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
        assert name.endswith("_total") == (spec.type == "counter"), name
        assert "percent" not in name
        assert "node" not in spec.labels and "hostname" not in spec.labels
        assert new_family(name).type == spec.type
