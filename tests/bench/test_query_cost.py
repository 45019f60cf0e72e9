"""``bench/query_cost.py``: the fleet page's queries kept exactly as the page sent them, each
replayed alone against a real Prometheus with the store's CPU and allocation; variants from a
file; bad input is one error line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fleet, query_cost
from gpuscope.dashboard.data.promql import scoped
from gpuscope.dashboard.plan import PrometheusData
from tests.stores import Store, start_prometheus


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("query-cost") / "set"
    fleet.build(out, 12, step=60.0, stores=("prometheus",), log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def store(data: Path) -> Iterator[Store]:
    with start_prometheus(data / "tsdb") as s:
        yield s


def test_the_page_queries_are_kept_as_sent(data: Path, store: Store) -> None:
    end = fleet.load_meta(data)["end"]
    sent = query_cost.page_queries(store, end)
    texts = [s.query for s in sent]
    # The first round, rebuilt here for the same window (no rules loaded in this set):
    # every one of its queries is among those kept, word for word.
    source = PrometheusData(store.url, clock=lambda: end)
    try:
        # As the store sends them: each node its cluster's (scoped).
        first = {k: scoped(q, source.cluster_label) for k, q in
                 source.fleet_queries(source.window(3600.0), None, rules=False).items()}
    finally:
        source.close()
    assert set(first.values()) <= set(texts)
    # One page, not two: no query of the first round is kept twice.
    assert len([t for t in texts if t in first.values()]) == len(first)
    assert {s.path for s in sent} <= {"/api/v1/query", "/api/v1/query_range"}
    assert any(s.path.endswith("query_range") for s in sent)  # the findings' histories


def test_each_query_replayed_alone_gives_its_answer_and_its_cost(
        data: Path, store: Store) -> None:
    end = fleet.load_meta(data)["end"]
    sent = query_cost.instant_queries([
        "# every series' last hour, and a variant that sends back one number",
        'last_over_time({__name__=~"gpu_.+|container_.+"}[1h])',
        "",
        'count(last_over_time({__name__=~"gpu_.+|container_.+"}[1h]))',
    ], end)
    assert len(sent) == 2
    lines: list[str] = []
    costs = query_cost.measure(store, sent, runs=3, log=lines.append)
    every, count = costs
    assert every.rows == len(store.query(sent[0].query, end)) == store.scalar(
        sent[1].query, end)
    assert every.rows > 1000 and count.rows == 1
    for c in costs:
        assert c.cpu_s >= 0.0
        assert c.alloc_mib is not None  # Prometheus counts the bytes it allocates
    # The same series read, a row for each sent back: the answer is what costs more
    # (a few MiB here, against noise of a few KiB in reading /metrics).
    assert every.alloc_mib is not None and count.alloc_mib is not None
    assert every.alloc_mib > count.alloc_mib + 1.0 > 1.0
    assert len(lines) == 2 and "rows" in lines[0]
    assert "2 queries" in query_cost.summary(costs)


def test_a_variants_file_is_replayed_from_the_command_line(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    variants = tmp_path / "variants.promql"
    variants.write_text("count(gpu_info)\nsum by (node) (gpu_info)\n")
    assert query_cost.main(["--data", str(data), "--queries", str(variants),
                            "--runs", "1", "--json"]) == 0
    out = capsys.readouterr().out
    assert "2 queries:" in out
    assert '"query": "sum by (node) (gpu_info)"' in out


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--runs", "0"], 2, "--runs must be >= 1"),
    (["--namespace", "Not A Namespace"], 2, "not a Kubernetes namespace name"),
    (["--head"], 1, "no meta.json and head/"),
    (["--store", "victoriametrics", "--head"], 2, "--head is Prometheus'"),
    (["--queries", "/nonexistent/variants"], 1, "/nonexistent/variants"),
])
def test_bad_input_is_one_error_line(data: Path, args: list[str], code: int, message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert query_cost.main(["--data", str(data), *args]) == code
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_folder_that_is_no_data_set_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tsdb").mkdir()
    (tmp_path / "meta.json").write_text("{not json")
    assert query_cost.main(["--data", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "not a data set's meta.json" in err and len(err.strip().splitlines()) == 1


def test_the_committed_variants_file_holds_the_pages_own_who_is_where_queries() -> None:
    """``bench/who_is_where.promql`` (docs/benchmarks.md, twelfth pass) beside the page as it
    is: it fails when the page's queries change and the file was not brought along."""
    lines = {s.query for s in query_cost.instant_queries(
        (query_cost.REPO / "bench" / "who_is_where.promql").read_text().splitlines(), 0.0)}
    source = PrometheusData("http://127.0.0.1:9", clock=lambda: 1_795_608_300.0)
    try:
        window = source.window(3600.0)
        # Who uses what, the inventory and the devices' means as asked where most nodes need
        # them (no node list), the shape the twelfth pass measured.
        page = {**source.fleet_queries(window, None, rules=True),
                **source.detail_queries(window, None, members=True),
                **source.means_queries(window, None)}
    finally:
        source.close()
    for role in ("gpu_stats", "members", "gpus", "pods"):
        assert page[role] in lines, role
