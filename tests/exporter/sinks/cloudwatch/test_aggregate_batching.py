"""Interval aggregates -> Values/Counts datums, and the PutMetricData limits, checked against
botocore's own serializers for every protocol CloudWatch speaks."""

from __future__ import annotations

import random
import urllib.parse
from datetime import UTC, datetime
from typing import Any

import botocore.serialize
import botocore.session
import pytest

from gpuscope.exporter.sinks.cloudwatch.aggregate import (
    MAX_VALUES_PER_DATUM,
    Aggregator,
    ClosedInterval,
    SeriesAggregate,
    datums_for,
)
from gpuscope.exporter.sinks.cloudwatch.batching import (
    ENVELOPE_BYTES,
    MAX_DATUMS_PER_REQUEST,
    MAX_REQUEST_BYTES,
    datum_size,
    make_batches,
    request_budget,
    request_problems,
)

KEY_A = ("nvidia_smi_utilization_gpu", (("host", "h"), ("index", "0")))
KEY_B = ("pod_gpu_utilization", (("ClusterName", "c"), ("Namespace", "n"), ("PodName", "p")))


def test_intervals_are_aligned_and_closed_only_when_over() -> None:
    agg = Aggregator(60.0)
    agg.add(120.0, [(KEY_A, 1.0)])
    agg.add(179.9, [(KEY_A, 3.0), (KEY_A, 1.0)])
    agg.add(180.0, [(KEY_A, 7.0)])
    assert agg.take_closed(179.99) == []
    closed = agg.take_closed(180.0)
    assert [c.start for c in closed] == [120.0]
    series = closed[0].series[KEY_A]
    assert (series.counts, series.minimum, series.maximum, series.total, series.n) == (
        {1.0: 2, 3.0: 1}, 1.0, 3.0, 5.0, 3)
    # A late round for an interval already taken opens it again (same timestamp).
    agg.add(150.0, [(KEY_A, 9.0)])
    assert [c.start for c in agg.take_all()] == [120.0, 180.0]


def test_non_finite_values_are_never_sent() -> None:
    agg = Aggregator(60.0)
    assert agg.add(0.0, [(KEY_A, float("nan")), (KEY_A, float("inf")), (KEY_A, 1e-200),
                         (KEY_A, 2.0)]) == 2
    assert agg.take_all()[0].series[KEY_A].counts == {0.0: 1, 2.0: 1}


def test_one_datum_per_series_with_values_and_counts() -> None:
    a = SeriesAggregate()
    for v in (5.0, 100.0, 5.0, 5.0, 20.0):  # a one-sample spike to 100
        a.add(v)
    b = SeriesAggregate()
    b.add(1.5)
    datums = datums_for(ClosedInterval(600.0, {KEY_B: b, KEY_A: a}))
    assert datums == [
        {"MetricName": "nvidia_smi_utilization_gpu",
         "Dimensions": [{"Name": "host", "Value": "h"}, {"Name": "index", "Value": "0"}],
         "Timestamp": datetime.fromtimestamp(600.0, tz=UTC),
         "Values": [5.0, 20.0, 100.0], "Counts": [3.0, 1.0, 1.0]},
        {"MetricName": "pod_gpu_utilization",
         "Dimensions": [{"Name": "ClusterName", "Value": "c"},
                        {"Name": "Namespace", "Value": "n"}, {"Name": "PodName", "Value": "p"}],
         "Timestamp": datetime.fromtimestamp(600.0, tz=UTC),
         "Values": [1.5], "Counts": [1.0], "Unit": "Percent"},
    ]


def test_more_than_150_distinct_values_split_into_datums_of_one_series() -> None:
    a = SeriesAggregate()
    values = [i / 8 for i in range(400)]
    for v in values:
        a.add(v)
    a.add(0.0)
    datums = datums_for(ClosedInterval(0.0, {KEY_A: a}))
    assert [len(d["Values"]) for d in datums] == [150, 150, 100]
    assert all(len(d["Values"]) <= MAX_VALUES_PER_DATUM for d in datums)
    assert {(d["MetricName"], d["Timestamp"]) for d in datums} == {
        (KEY_A[0], datetime.fromtimestamp(0.0, tz=UTC))}
    merged = {v: c for d in datums for v, c in zip(d["Values"], d["Counts"], strict=True)}
    assert merged == {**{v: 1.0 for v in values}, 0.0: 2.0}


# -- sizes against botocore's serializers ------------------------------------------------------

_OPERATION = botocore.session.get_session().get_service_model("cloudwatch").operation_model(
    "PutMetricData")


def wire_bytes(protocol: str, namespace: str, datums: list[dict[str, Any]]) -> int:
    """The body botocore would send for this request, in bytes (uncompressed)."""
    request = botocore.serialize.create_serializer(protocol).serialize_to_request(
        {"Namespace": namespace, "MetricData": datums}, _OPERATION)
    body = request["body"]
    if isinstance(body, dict):  # query: form-encoded by the HTTP layer
        return len(urllib.parse.urlencode(body).encode())
    return len(body)


def random_datums(n: int, values: int, rng: random.Random, dim_len: int = 20
                  ) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        vals = sorted({rng.random() * 10 ** rng.randint(0, 9) for _ in range(values)})
        out.append({
            "MetricName": f"nvidia_smi_metric_{i % 10}",
            "Dimensions": [{"Name": f"Dim{j}", "Value": f"{i}-{j}-" + "x" * dim_len}
                           for j in range(7)],
            "Timestamp": datetime.fromtimestamp(1_784_000_000.0 + i, tz=UTC),
            "Values": vals, "Counts": [float(rng.randint(1, 3600)) for _ in vals],
            "Unit": "Percent",
        })
    return out


@pytest.mark.parametrize("protocol", ["json", "query", "smithy-rpc-v2-cbor"])
def test_estimate_is_never_below_the_real_body(protocol: str) -> None:
    rng = random.Random(7)
    datums = random_datums(60, 150, rng, dim_len=200) + random_datums(60, 1, rng)
    estimated = sum(datum_size(d, protocol) for d in datums) + ENVELOPE_BYTES
    assert wire_bytes(protocol, "CWAgent", datums) <= estimated
    for d in datums[:5]:
        alone = wire_bytes(protocol, "CWAgent", [d])
        assert alone <= datum_size(d, protocol) + ENVELOPE_BYTES


@pytest.mark.parametrize("protocol", ["json", "query", "smithy-rpc-v2-cbor"])
def test_batches_respect_every_limit_on_the_wire(protocol: str) -> None:
    rng = random.Random(11)
    big = random_datums(160, 150, rng, dim_len=1000)   # size binds first
    small = random_datums(2100, 1, rng, dim_len=1)     # count binds first
    for datums in (big, small):
        batches = make_batches(datums, "CWAgent", protocol)
        assert [d for b in batches for d in b] == datums  # all of them, in order
        for batch in batches:
            assert request_problems("CWAgent", batch, protocol) == []
            assert len(batch) <= MAX_DATUMS_PER_REQUEST
            assert wire_bytes(protocol, "CWAgent", batch) <= MAX_REQUEST_BYTES
    assert len(make_batches(small, "CWAgent", protocol)) == 3
    assert len(make_batches(big, "CWAgent", protocol)) > 1  # 160 datums, yet > 1 MB


def test_request_problems_names_each_broken_limit() -> None:
    datum = {"MetricName": "m", "Dimensions": [{"Name": f"d{i}", "Value": "v"} for i in range(31)],
             "Values": [float(i) for i in range(151)], "Counts": [1.0] * 150}
    problems = request_problems("CWAgent", [datum] * 1001, "json")
    text = "\n".join(problems)
    assert "1001 datums > 1000" in text
    assert "31 dimensions > 30" in text
    assert "151 values > 150" in text
    assert "150 counts for 151 values" in text
    assert request_budget("CWAgent") < MAX_REQUEST_BYTES
