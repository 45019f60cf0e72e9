"""Fuzzing the price-table loader (``dashboard.prices``).

Documented: "A bad file raises :class:`PriceError` with one line" naming the file (and the
key); ``gpuscope-dashboard --prices FILE`` prints it and exits 2. So arbitrary text, arbitrary
YAML-shaped documents and mutations of the bundled ``dashboard/prices.yaml`` either give a
table of finite, non-negative prices or raise ``PriceError`` with one line that starts with
the file name. Settings: ``tests/fuzz/_profile.py``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.dashboard.prices import PriceError, PriceTable, load_prices, parse_prices
from tests.conftest import REPO
from tests.fuzz._profile import fuzz
from tests.fuzz._strategies import NUMBERS, SCALARS, yaml_like
from tests.fuzz._strategies import mutated as mutated_doc

KEYS = st.sampled_from(["tables", "prices", "currency", "p5.48xlarge", "provider", "region",
                        "date", "source"])
DOCS = yaml_like(KEYS)
BUNDLED_DOC = yaml.safe_load((REPO / "dashboard" / "prices.yaml").read_text())
SOURCE = "prices-fuzz.yaml"


def check_error(exc: PriceError, source: str) -> None:
    text = str(exc)
    assert text and text.splitlines() == [text], repr(text)
    assert text.startswith(source) or text.startswith(repr(source)), text


def check_table(table: PriceTable) -> None:
    for entry in table.entries():
        assert isinstance(entry.instance_type, str) and entry.instance_type.strip()
        assert math.isfinite(entry.per_hour) and entry.per_hour >= 0
        assert table.lookup(entry.instance_type) is not None


@pytest.fixture(scope="module")
def scratch() -> Iterator[str]:
    """One file, rewritten for every example (a function-scoped tmp_path would be shared
    across Hypothesis examples anyway)."""
    with tempfile.TemporaryDirectory() as d:
        yield os.path.join(d, "prices.yaml")


def load_text(path: str, data: str | bytes) -> None:
    with open(path, "wb") as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    try:
        table = load_prices(path)
    except PriceError as exc:
        check_error(exc, path)
    else:
        check_table(table)


_PIECES = st.sampled_from([
    "currency: USD\n", "currency: EUR\n", "tables:\n", "  - provider: aws\n", "    prices:\n",
    "      p5.48xlarge: ", "prices: ", "{", "}", "[", "]", ": ", "\n", "- ", "'", '"', "&a ",
    "*a", "!!float ", "!!int ", "!!bool ", "!!timestamp ", "? ", ".nan", ".inf", "-1", "1e999",
    "9" * 400, "9" * 5000, "\x00", "\ufeff", "é", "2026-01-01", "~", "true",
])
YAMLISH = st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=30).map("".join)


@fuzz(200)
@given(data=st.one_of(st.text(), YAMLISH, st.binary(max_size=200)))
@example("p5.48xlarge: " + "9" * 400 + "\n")  # float() of a huge int overflowed
@example("p5.48xlarge: " + "9" * 5000 + "\n")  # int() refuses > 4300 digits
@example('"p5\\nx": lots\n')  # a newline inside a quoted key: two lines
@example("[" * 3000 + "]" * 3000)  # deeper than the recursion limit
@example("p5: !!float abc\n")
@example("p5: !!bool abc\n")
@example("p5: !!timestamp abc\n")
@example("!!int")  # IndexError inside PyYAML
@example(b"p5: 1\n\xff\n")  # not UTF-8
def test_any_price_file_loads_or_fails_with_one_line(scratch: str, data: str | bytes) -> None:
    load_text(scratch, data)


@fuzz(200)
@given(doc=st.one_of(DOCS, st.dictionaries(st.one_of(KEYS, st.text(max_size=8)), DOCS,
                                           max_size=5)))
@example({"p5.48xlarge": 10**400})
@example({"a\nb": "lots"})
@example({"tables": [{"prices": {"x": -(10**400)}}]})
@example({"currency": "X" * 10_000})
def test_any_document_parses_or_fails_with_one_line(doc: Any) -> None:
    try:
        table = parse_prices(doc, SOURCE)
    except PriceError as exc:
        check_error(exc, SOURCE)
    else:
        check_table(table)


BAD = st.one_of(SCALARS, NUMBERS, DOCS, st.sampled_from(
    [-1, -0.01, 10**400, math.nan, math.inf, "", " ", "EUR", [], {}, None, True, "1.5"]))


# Renamed and added keys: any text, or the non-string keys YAML allows.
ODD_KEYS = st.one_of(st.text(max_size=10), st.integers(), st.none(), st.booleans())


def mutated() -> st.SearchStrategy[Any]:
    return mutated_doc([BUNDLED_DOC], BAD, ODD_KEYS)


@fuzz(200)
@given(doc=mutated())
def test_mutated_bundled_table_parses_or_fails_with_one_line(doc: Any) -> None:
    try:
        table = parse_prices(doc, SOURCE)
    except PriceError as exc:
        check_error(exc, SOURCE)
    else:
        check_table(table)


@fuzz(60)
@given(doc=mutated())
def test_mutated_bundled_table_as_a_file_loads_or_fails_with_one_line(
    scratch: str, doc: Any,
) -> None:
    load_text(scratch, yaml.safe_dump(doc))


def test_unreadable_paths_are_one_line_errors(tmp_path: Any) -> None:
    for path in (str(tmp_path), str(tmp_path / "missing.yaml"), "a\x00b", "line\nbreak"):
        with pytest.raises(PriceError) as info:
            load_prices(path)
        assert str(info.value).splitlines() == [str(info.value)]
