"""The Grafana dashboards' panels as an SRE reads them, against a real Prometheus holding the
demo fleet (the store of ``tests/alerts/test_grafana.py``): what each series is called in a
legend, and the same panels on a store of several clusters.

Legends are rendered as Grafana renders them (``renderLegendFormat`` of ``@grafana/data``:
``{{label}}`` is the series' value of the label, and the label's *name* where the series
has no such label or an empty one; Prometheus leaves empty labels out of its answers).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuscope.alerts.grafana.dashboards import DASHBOARDS
from tests.alerts.test_grafana import (
    VALUES,
    _run,
    dashboards,
    panels,
)
from tests.alerts.test_grafana import demo_prometheus as demo_prometheus
from tests.alerts.test_grafana import demo_samples as demo_samples

_PLACEHOLDER = re.compile(r"\{\{\s*(.+?)\s*\}\}")


def legend(pattern: str, labels: dict[str, str]) -> str:
    """A series' name in a legend, as Grafana writes it."""
    return _PLACEHOLDER.sub(lambda m: labels.get(m.group(1)) or m.group(1), pattern)


def legended_targets(name: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(dashboards()[name]):
        for target in panel.get("targets", []):
            if target.get("legendFormat") and _PLACEHOLDER.search(target["legendFormat"]):
                yield panel, target


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_legend_names_its_series_by_labels_they_have(
        name: str, demo_prometheus: str) -> None:
    """Each label a legend names is on every series the query returns (a whole GPU has no
    ``mig_profile``: "GPU 0 {{mig_profile}}" read "GPU 0 mig_profile"), and no two series
    of one query share a name."""
    now = time.time()
    wrong = []
    shown_by_title: dict[str, set[str]] = {}
    for panel, target in legended_targets(name):
        wanted = set(_PLACEHOLDER.findall(target["legendFormat"]))
        for values in VALUES[name]:
            result = _run(demo_prometheus, target, values, now)
            names = [legend(target["legendFormat"], r["metric"]) for r in result]
            shown_by_title.setdefault(panel["title"], set()).update(names)
            for r, shown in zip(result, names, strict=True):
                missing = sorted(label for label in wanted if not r["metric"].get(label))
                if missing:
                    wrong.append(f"{panel['title']} / {target['refId']}: {shown!r} "
                                 f"(no {', '.join(missing)})")
            if len(names) != len(set(names)):
                wrong.append(f"{panel['title']} / {target['refId']}: names repeat: "
                             f"{sorted(n for n in set(names) if names.count(n) > 1)}")
    assert not wrong, "\n".join(sorted(set(wrong)))
    if name == "gpuscope-node":
        # A MIG slice is named with its profile, a whole GPU by its index alone.
        assert {"GPU 0", "GPU 6/1 3g.40gb"} <= shown_by_title["SM activity (GPM)"]
