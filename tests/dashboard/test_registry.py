"""The verdict registry drives the page: every verdict's section is laid out in registry
order with its tables, every table is filled by the fleet callback by its id, and the
element ids are unique (issue 29, item 1)."""

from __future__ import annotations

from typing import Any

from gpuscope.dashboard import ids, sections
from gpuscope.dashboard.layout import layout
from gpuscope.dashboard.verdicts import registry


def _ids(component: Any) -> list[str]:
    """Every element id under ``component``, in document order."""
    found = []
    own = getattr(component, "id", None)
    if isinstance(own, str):
        found.append(own)
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, str):
            found += _ids(child)
    return found


def test_every_section_is_laid_out_in_registry_order_with_its_tables() -> None:
    page = _ids(layout())
    assert len(page) == len(set(page)), "an element id is used twice"
    order = [page.index(s.id) for s in registry.SECTIONS]
    assert order == sorted(order)
    for section in registry.SECTIONS:
        for table in section.tables:
            assert page.index(section.id) < page.index(table.id) < page.index(table.note_id)
        if section.header_id:
            assert section.header_id in page
    assert set(ids.DESIGN_IDS) <= set(page)


def test_every_table_of_the_registry_is_filled_by_id() -> None:
    assert sections.missing() == []
    written = sections.outputs()
    assert len(written) == len(set(written))
    tables = {t.id for s in registry.SECTIONS for t in s.tables}
    assert tables <= {i for i, prop in written if prop == "data"}


def test_a_verdicts_columns_are_unique_and_kinds_known() -> None:
    for section in registry.SECTIONS:
        for table in section.tables:
            cols = [c.id for c in table.columns]
            assert len(cols) == len(set(cols)), table.id
            assert {c.kind for c in table.columns} <= {"text", "link", "money", "percent",
                                                       "count", "ratio"}


def test_the_embedded_stores_straggler_default_is_the_verdicts() -> None:
    """The embedded store keeps its own copy of the stragglers' default duration (it may
    not import the verdict layer when it loads): the two stay equal."""
    from gpuscope.dashboard.data import embedded
    from gpuscope.dashboard.verdicts import stragglers

    assert embedded.STRAGGLER_DURATION == stragglers.STRAGGLER_DURATION


def test_the_registrys_thresholds_are_every_field_of_thresholds() -> None:
    """Each verdict module declares its thresholds; together they are the fields of
    Thresholds, each once, so that every threshold has its flag and no flag is orphaned."""
    from dataclasses import fields

    from gpuscope.dashboard.verdicts import Thresholds

    declared = [t.field for t in registry.THRESHOLDS]
    assert len(declared) == len(set(declared))
    assert set(declared) == {f.name for f in fields(Thresholds)}
    assert all(t.flag == "--" + t.field.replace("_", "-") and t.help for t in registry.THRESHOLDS)


def test_the_thresholds_key_tells_thresholds_apart() -> None:
    from dataclasses import replace

    from gpuscope.dashboard.verdicts import Thresholds

    base = Thresholds()
    assert base.key == Thresholds().key and len(base.key) == 12
    # The same values however they were given (a whole number of seconds, a float).
    assert replace(base, idle_duration=1800).key == base.key
    keys = {base.key, replace(base, idle_utilization=0.1).key,
            replace(base, throttle_reasons=("power",)).key,
            replace(base, input_min_samples=11).key}
    assert len(keys) == 4


def test_a_priced_tables_order_is_a_money_column() -> None:
    """A table that says which money column orders it names one of its money columns; every
    table with a money column says so (its first rows, the ones sent, are the costliest)."""
    for section in registry.SECTIONS:
        for table in section.tables:
            money = {c.id for c in table.columns if c.kind == "money"}
            assert (table.order in money) if money else not table.order, table.id
