"""PutMetricData limits, enforced here because nothing downstream does (moto accepts
anything; real CloudWatch answers a whole request with a 400).

Limits per request: at most 1,000 datums and 1 MB of request body; per datum: at most 30
dimensions and 150 distinct values (``Values``/``Counts``, one count per value).

Request size is *estimated conservatively* per datum, for the wire protocol the client
actually speaks:

- ``json`` (botocore >= 1.3x for CloudWatch: ``application/x-amz-json-1.0``): the datum's own
  ``json.dumps`` length, as botocore serializes it (ASCII-escaped, ``", "`` separators), plus
  two bytes of separator;
- ``query`` (older botocore: ``application/x-www-form-urlencoded``): the length of every
  ``MetricData.member.N.…=value&`` pair, percent-encoded, with ``N`` counted at its widest
  (four digits);
- anything else (e.g. ``smithy-rpc-v2-cbor``): the query estimate, the most verbose of the
  three.

The budget is 1,000,000 bytes (not 1 MiB) minus :data:`ENVELOPE_BYTES` for the rest of the
body. botocore gzips bodies of 10 KB or more; the estimate is of the uncompressed body, so
the limit holds whether CloudWatch applies it before or after decompression.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from urllib.parse import quote

from gpuscope.exporter.sinks.cloudwatch.aggregate import MAX_VALUES_PER_DATUM, Datum

MAX_DATUMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000
MAX_DIMENSIONS = 30
#: Room for everything in the body that is not a datum (namespace, action, version, braces).
ENVELOPE_BYTES = 2048
#: Longest query-protocol member prefix: ``MetricData.member.1000.``.
_QUERY_PREFIX_LEN = len("MetricData.member.1000.")
#: Upper bound of an ISO 8601 timestamp with microseconds, percent-encoded.
_QUERY_TIMESTAMP_LEN = len(quote("2026-07-20T10:00:00.000000Z", safe=""))


def _number_text(value: float) -> str:
    return repr(float(value))


def _query_pairs(datum: Datum) -> Iterator[tuple[str, str]]:
    for key, value in datum.items():
        if key == "Dimensions":
            for j, dim in enumerate(value, start=1):
                yield f"Dimensions.member.{j}.Name", str(dim["Name"])
                yield f"Dimensions.member.{j}.Value", str(dim["Value"])
        elif key in ("Values", "Counts"):
            for j, number in enumerate(value, start=1):
                yield f"{key}.member.{j}", _number_text(number)
        elif key == "StatisticValues":
            for stat, number in value.items():
                yield f"StatisticValues.{stat}", _number_text(number)
        elif key == "Timestamp":
            yield key, ""  # sized separately
        elif isinstance(value, float | int) and not isinstance(value, bool):
            yield key, _number_text(value)
        else:
            yield key, str(value)


def query_size(datum: Datum) -> int:
    """Bytes this datum adds to a query-protocol body (an upper bound)."""
    size = 0
    for key, value in _query_pairs(datum):
        size += _QUERY_PREFIX_LEN + len(quote(key, safe="")) + 1 + len(quote(value, safe="")) + 1
        if key == "Timestamp":
            size += _QUERY_TIMESTAMP_LEN
    return size


def _jsonable(datum: Datum) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in datum.items():
        if isinstance(value, datetime):
            out[key] = value.timestamp()
        else:
            out[key] = value
    return out


def json_size(datum: Datum) -> int:
    """Bytes this datum adds to a JSON-protocol body (exact, plus the ``", "`` separator)."""
    return len(json.dumps(_jsonable(datum))) + 2


def datum_size(datum: Datum, protocol: str) -> int:
    """Conservative size in bytes of one datum in a request of ``protocol``."""
    if protocol == "json":
        return json_size(datum)
    return query_size(datum)


def request_budget(namespace: str) -> int:
    """Bytes available to datums in one request."""
    return MAX_REQUEST_BYTES - ENVELOPE_BYTES - 3 * len(quote(namespace, safe=""))


def datum_problems(datum: Datum) -> list[str]:
    """What makes ``datum`` unacceptable to PutMetricData (empty when nothing)."""
    problems = []
    dims = datum.get("Dimensions", ())
    if len(dims) > MAX_DIMENSIONS:
        problems.append(f"{datum['MetricName']}: {len(dims)} dimensions > {MAX_DIMENSIONS}")
    for dim in dims:
        if not dim["Value"] or len(dim["Value"]) > 1024 or not dim["Name"]:
            problems.append(f"{datum['MetricName']}: bad dimension {dim!r}")
    values = datum.get("Values")
    if values is not None:
        counts = datum.get("Counts")
        if len(values) > MAX_VALUES_PER_DATUM:
            problems.append(
                f"{datum['MetricName']}: {len(values)} values > {MAX_VALUES_PER_DATUM}")
        if counts is not None and len(counts) != len(values):
            problems.append(f"{datum['MetricName']}: {len(counts)} counts for "
                            f"{len(values)} values")
        if len(set(values)) != len(values):
            problems.append(f"{datum['MetricName']}: repeated values")
    return problems


def request_problems(namespace: str, datums: Sequence[Datum], protocol: str) -> list[str]:
    """Every limit one PutMetricData request of ``datums`` would break (empty when none)."""
    problems: list[str] = []
    if not datums:
        problems.append("no datums")
    if len(datums) > MAX_DATUMS_PER_REQUEST:
        problems.append(f"{len(datums)} datums > {MAX_DATUMS_PER_REQUEST}")
    size = sum(datum_size(d, protocol) for d in datums)
    if size > request_budget(namespace):
        problems.append(f"estimated {size} bytes > {request_budget(namespace)}")
    for d in datums:
        problems.extend(datum_problems(d))
    return problems


def take_batch(datums: Sequence[Datum], namespace: str, protocol: str,
               start: int = 0) -> tuple[int, int]:
    """How many datums from ``datums[start:]`` fit in one request, and their estimated
    size in bytes. Always at least one (a single datum is far below the limits)."""
    budget = request_budget(namespace)
    size = 0
    end = start
    while end < len(datums) and end - start < MAX_DATUMS_PER_REQUEST:
        add = datum_size(datums[end], protocol)
        if end > start and size + add > budget:
            break
        size += add
        end += 1
    return end - start, size


def make_batches(datums: Sequence[Datum], namespace: str, protocol: str
                 ) -> list[list[Datum]]:
    """``datums`` cut, in order, into requests that each respect every limit."""
    batches = []
    start = 0
    while start < len(datums):
        n, _ = take_batch(datums, namespace, protocol, start)
        batches.append(list(datums[start:start + n]))
        start += n
    return batches
