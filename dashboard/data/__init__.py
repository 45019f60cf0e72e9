"""Data access: the only package that talks to Prometheus or scrapes exporters.

One module per data mode, all behind the :class:`~gpuscope.dashboard.data.source.DataSource`
protocol and all returning the same :class:`~gpuscope.dashboard.series.FleetData` /
``NodeDetail`` / ``PodDetail``:

- :mod:`.prometheus` (``--prometheus URL``): any Prometheus-compatible HTTP API, every
  aggregation server-side (the fleet page's plan of queries on it is
  :mod:`gpuscope.dashboard.plan`, above the verdicts);
- :mod:`.embedded` (``--targets URL,...``): scrapes exporters directly into a bounded window;
- the demo (``--demo``, :mod:`gpuscope.dashboard.demo`) runs simulated exporters in-process
  and an embedded data source on them.

:mod:`.source` holds what they share (protocol, errors, name validation, windows),
:mod:`.promql` the escaping that keeps user input from changing a query, and :mod:`.steps`
the series a verdict declares it reads (:class:`~.steps.StepQuery`), which every store
answers (``step_series``).
"""

from gpuscope.dashboard.data.embedded import EmbeddedData
from gpuscope.dashboard.data.prometheus import PrometheusStore
from gpuscope.dashboard.data.promql import escape_label_value, selector
from gpuscope.dashboard.data.source import (
    INFO_LOOKBACK,
    DataError,
    DataSource,
    InvalidFilter,
    make_window,
    validate_cluster,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.data.targets import Sample, Target, parse_targets

__all__ = [
    "INFO_LOOKBACK",
    "DataError",
    "DataSource",
    "EmbeddedData",
    "InvalidFilter",
    "PrometheusStore",
    "Sample",
    "StepQuery",
    "Target",
    "escape_label_value",
    "make_window",
    "parse_targets",
    "selector",
    "validate_cluster",
    "validate_namespace",
    "validate_node",
    "validate_pod",
    "validate_workload",
]
