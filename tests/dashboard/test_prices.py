"""The bundled price table and --prices overrides."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuscope.dashboard.prices import (
    NodePrice,
    PriceError,
    bundled_prices,
    load_prices,
    node_price_promql,
)

ANCHORS = {
    "p5.48xlarge": 55.04, "p4d.24xlarge": 21.957642, "p3.8xlarge": 12.24,
    "g5.12xlarge": 5.672, "g5.xlarge": 1.006, "g6.xlarge": 0.8048, "g4dn.xlarge": 0.526,
}


def test_bundled_table_has_the_aws_anchor_prices_with_date_and_source() -> None:
    table = bundled_prices()
    for itype, price in ANCHORS.items():
        entry = table.lookup(itype)
        assert entry is not None and entry.per_hour == price
        assert entry.provider == "aws" and entry.date == "2026-07-20"
        assert entry.region == "us-east-1" and entry.source
    for entry in table.entries():
        assert entry.per_hour > 0 and entry.date and entry.source and entry.region
    providers = {e.provider for e in table.entries()}
    assert providers == {"aws", "gcp", "azure"}


def test_unknown_instance_type_has_no_price() -> None:
    table = bundled_prices()
    assert table.per_hour("DGX-A100") is None
    assert table.per_hour("") is None
    assert table.per_hour("standard_nc24ads_a100_v4") == 3.673  # case-insensitive fallback


def test_override_file_wins_and_adds(tmp_path: Path) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text("p5.48xlarge: 40.0\nDGX-A100: 0\n")
    table = load_prices(f)
    assert table.per_hour("p5.48xlarge") == 40.0
    assert table.per_hour("DGX-A100") == 0.0       # explicitly free is allowed
    assert table.per_hour("g5.12xlarge") == 5.672  # the rest stays


def test_override_in_table_format(tmp_path: Path) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text("tables:\n  - provider: onprem\n    date: '2026-01-01'\n"
                 "    prices: {DGX-A100: 9.5}\n")
    entry = load_prices(f).lookup("DGX-A100")
    assert entry is not None and entry.per_hour == 9.5 and entry.provider == "onprem"


@pytest.mark.parametrize(("text", "message"), [
    ("p5.48xlarge: lots\n", "p5.48xlarge: expected a number"),
    ("p5.48xlarge: -1\n", "expected a price >= 0"),
    ("- a\n- b\n", "expected a mapping"),
    ("p5: [\n", "invalid YAML"),
    ("currency: EUR\np5.48xlarge: 3\n", "only USD"),
    ("tables: 3\n", "tables: expected a list"),
    # A key written twice was the last one silently: which price did the user mean?
    ("p5.48xlarge: 30\ng5.xlarge: 1\np5.48xlarge: 40\n",
     "line 3, column 1: invalid YAML: duplicate key 'p5.48xlarge'"),
    ("spot:\n  g6.xlarge: 0.3\n  g6.xlarge: 0.4\n", "duplicate key 'g6.xlarge'"),
])
def test_bad_files_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text(text)
    with pytest.raises(PriceError) as info:
        load_prices(f)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert str(f) in str(info.value)


def test_numbers_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    """``1e1`` is a number (YAML 1.1, PyYAML's default, reads it as text: "expected a
    number"); a quoted price stays text and is refused."""
    f = tmp_path / "prices.yaml"
    f.write_text("p5.48xlarge: 1e1\ng5.xlarge: 2.5E-1\n")
    table = load_prices(f)
    assert table.per_hour("p5.48xlarge") == 10.0
    assert table.per_hour("g5.xlarge") == 0.25
    f.write_text("p5.48xlarge: '10'\n")
    with pytest.raises(PriceError, match=r"p5\.48xlarge: expected a number"):
        load_prices(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PriceError, match="cannot read"):
        load_prices(tmp_path / "nope.yaml")


def test_spot_prices_from_the_price_file(tmp_path: Path) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text("g6.xlarge: 0.80\nspot:\n  g6.xlarge: 0.31\n")
    table = load_prices(f)
    assert table.node_price("g6.xlarge", "spot") == NodePrice(0.31, "spot")
    assert table.node_price("g6.xlarge", "on-demand") == NodePrice(0.80, "on-demand")
    assert table.node_price("g6.xlarge", "") == NodePrice(0.80, "on-demand")
    # A spot node with no spot price is priced on demand, and says so.
    assert table.node_price("p5.48xlarge", "spot") == NodePrice(55.04, "on-demand (no spot price)")
    assert table.node_price("DGX-A100", "spot").per_hour is None
    # The bundled table has no spot prices: they change by the hour and by zone.
    assert bundled_prices().spot_entries() == []


def test_spot_prices_in_table_format(tmp_path: Path) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text("tables:\n  - provider: aws\n    region: us-east-1\n    date: '2026-11-20'\n"
                 "    capacity_type: spot\n    prices: {p5.48xlarge: 21.5}\n")
    table = load_prices(f)
    assert table.node_price("p5.48xlarge", "spot") == NodePrice(21.5, "spot")
    assert table.per_hour("p5.48xlarge") == 55.04  # the on-demand price is untouched
    f.write_text("tables:\n  - capacity_type: reserved\n    prices: {x: 1}\n")
    with pytest.raises(PriceError, match="capacity_type: expected on-demand or spot"):
        load_prices(f)


#: Nodes and their ``gpu_node_info`` labels (instance type, capacity type) for the store's
#: prices: exact and other-case names, spot with and without a spot price, unknown and
#: empty types, two entries that differ only in case, a name with regex metacharacters.
PRICED_NODES = {
    "n-exact": ("p5.48xlarge", "on-demand"), "n-case": ("P5.48XLARGE", ""),
    "n-spot": ("g6.xlarge", "spot"), "n-spot-case": ("G6.XLARGE", "spot"),
    "n-no-spot": ("g5.xlarge", "spot"), "n-unknown": ("dgx.a100", "on-demand"),
    "n-unknown-spot": ("dgx.a100", "spot"), "n-empty": ("", ""),
    "n-twin-a": ("Custom.GPU", ""), "n-twin-b": ("custom.gpu", "on-demand"),
    "n-twin-other": ("CUSTOM.gpu", ""), "n-meta": ("a+b(1)|c", ""), "n-meta-near": ("ab(1)", ""),
}


def test_the_stores_price_each_node_as_the_table_does(tmp_path: Path) -> None:
    """``node_price_promql`` evaluated by a real Prometheus and VictoriaMetrics gives each
    node the price and basis ``PriceTable.node_price`` gives it, and no series where it has
    none."""
    from tests.stores import promtool_blocks, start_prometheus, start_victoriametrics

    f = tmp_path / "prices.yaml"
    f.write_text("Custom.GPU: 3.0\ncustom.gpu: 4.0\n'a+b(1)|c': 7.5\nspot:\n  g6.xlarge: 0.31\n")
    table = load_prices(f)
    at = int(time.time()) - 600
    lines = [f'gpu_node_info{{node="{node}",instance_type="{it}",capacity_type="{ct}"}} 1'
             for node, (it, ct) in PRICED_NODES.items()]
    om = tmp_path / "nodes.om"
    om.write_text("# TYPE gpu_node_info gauge\n"
                  + "".join(f"{line} {at}\n" for line in lines) + "# EOF\n")
    promtool_blocks(om, tmp_path / "tsdb")
    expected = {node: table.node_price(it, ct) for node, (it, ct) in PRICED_NODES.items()}
    expected = {n: p for n, p in expected.items() if p.per_hour is not None}
    assert len(expected) == 9  # (what the table prices: the test's own check)
    query = node_price_promql(table)
    with start_prometheus(tmp_path / "tsdb") as prom, start_victoriametrics() as vm:
        vm.import_lines([("".join(f"{line} {at * 1000}\n" for line in lines)).encode()],
                        fmt="prometheus")
        vm.flush()
        for store in (prom, vm):
            got = {r["metric"]["node"]: NodePrice(float(r["value"][1]), r["metric"]["basis"])
                   for r in store.query(query, at)}
            assert got == expected, store.kind


@pytest.mark.parametrize(("text", "where"), [
    ("p5.48xlarge: free\n", ": p5.48xlarge: "),
    ("prices:\n  p5.48xlarge: free\n", ": prices.p5.48xlarge: "),
    ("spot:\n  p5.48xlarge: free\n", ": spot.p5.48xlarge: "),
    ("tables:\n  - prices: {p5.48xlarge: free}\n", ": tables[0].prices.p5.48xlarge: "),
])
def test_a_bad_price_is_named_after_the_file_then_its_key(
        tmp_path: Path, text: str, where: str) -> None:
    """docs/dashboard.md: ``--prices prices.yaml: p5.48xlarge: expected ...``; a plain
    mapping's key is not joined to the file's name (``prices.yaml.p5.48xlarge``)."""
    f = tmp_path / "prices.yaml"
    f.write_text(text)
    with pytest.raises(PriceError) as info:
        load_prices(f)
    assert str(info.value) == (
        f"{f}{where}expected a number of dollars per hour, got 'free'")


def test_an_override_wins_whatever_case_it_is_written_in(tmp_path: Path) -> None:
    """The bundled ``Standard_NC24ads_A100_v4`` and a file's ``standard_nc24ads_a100_v4``
    name one instance type (looked up case-insensitively): the file's price wins for a node
    labelled either way, on demand and spot alike, in the table and in the store's query."""
    f = tmp_path / "prices.yaml"
    f.write_text("standard_nc24ads_a100_v4: 2.5\nP5.48XLARGE: 40.0\n"
                 "spot: {P5.48XLARGE: 20.0}\n")
    table = load_prices(f)
    for name in ("Standard_NC24ads_A100_v4", "standard_nc24ads_a100_v4"):
        assert table.per_hour(name) == 2.5
    assert table.node_price("p5.48xlarge", "on-demand") == NodePrice(40.0, "on-demand")
    assert table.node_price("p5.48xlarge", "spot") == NodePrice(20.0, "spot")
    assert "55.04" not in node_price_promql(table)
    # Both spellings stay (the price rules match names exactly), at the file's price.
    assert {(p.instance_type, p.per_hour) for p in table.entries()
            if p.instance_type.lower() == "standard_nc24ads_a100_v4"} == {
        ("Standard_NC24ads_A100_v4", 2.5), ("standard_nc24ads_a100_v4", 2.5)}
    # Twins of the file itself keep each its own price.
    f.write_text("Custom.GPU: 3.0\ncustom.gpu: 4.0\n")
    table = load_prices(f)
    assert (table.per_hour("Custom.GPU"), table.per_hour("custom.gpu")) == (3.0, 4.0)


@pytest.mark.parametrize(("text", "message"), [
    # Karpenter's label is karpenter.sh/capacity-type: the table's spot prices were read
    # as on-demand ones, replacing the bundled on-demand price of every node of the type.
    ("tables:\n  - capacity-type: spot\n    prices: {p5.48xlarge: 21.5}\n",
     ": tables[0]: unknown key 'capacity-type' (expected capacity_type, date, prices, "
     "provider, region, source)"),
    # spot: beside tables: was dropped, its nodes priced on demand.
    ("tables:\n  - prices: {p5.48xlarge: 40}\nspot:\n  p5.48xlarge: 21.5\n",
     ": unknown key 'spot' beside 'tables' (expected currency, tables)"),
    # An entry beside prices: was dropped, its node kept the bundled price or none.
    ("prices:\n  p5.48xlarge: 40\nDGX-A100: 9.5\n",
     ": unknown key 'DGX-A100' beside 'prices' (expected currency, prices, spot)"),
])
def test_a_key_the_file_does_not_use_is_an_error_not_dropped(
        tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "prices.yaml"
    f.write_text(text)
    with pytest.raises(PriceError) as info:
        load_prices(f)
    assert str(info.value) == f"{f}{message}"
