"""Prometheus text format 0.0.4, byte for byte what ``prometheus_client.generate_latest``
writes, in about half the time.

``generate_latest`` validates and escapes every label name and sorts every label set on every
line. Here each distinct (sample name, label names) pair gets a format template once per
scrape (label names escaped and sorted once), and each distinct label value is escaped once
per scrape. Everything else follows ``generate_latest`` (prometheus_client 0.26,
``exposition.py``) rule for rule, with its default ``underscores`` name escaping:

- counters are named ``<name>_total``, info ``<name>_info`` (a gauge), stateset a gauge,
  gaugehistogram a histogram, unknown ``untyped``;
- HELP escapes backslash and newline; label values escape backslash, newline and double
  quote; label pairs are sorted by name; values are ``floatToGoString``; a sample timestamp
  is appended in milliseconds;
- ``_created``, ``_gsum`` and ``_gcount`` samples (OpenMetrics-only) are moved out of their
  family into a gauge family of their own after it, ordered by suffix. (gpuscope's families
  have none: its counters are built without a creation time.)

``tests/exporter/sinks/prometheus/test_exposition.py`` compares the bytes with
``generate_latest`` on the fixed snapshot, on the full simulated registry (with and without
per-process series) and on adversarial label values, so a prometheus_client upgrade that changes
the format fails there.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

__all__ = ["CONTENT_TYPE", "generate_text"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # text/plain; version=0.0.4; charset=utf-8

# Type munging from OpenMetrics into the Prometheus text format: (name suffix, type).
_TYPES = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_float_to_go_string: Callable[[float], str] = _untyped_float_to_go_string
_INF = float("inf")
_NEG_INF = float("-inf")
# floatToGoString switches to Go's exponent form for positive values with more than six
# digits before the point; below 1e6 (and for every finite negative value) it is repr().
_GO_EXPONENT_FROM = 1_000_000.0


class _Escaped(dict[str, str]):
    """Label value → escaped label value, filled on first use (one scrape's values)."""

    def __missing__(self, value: str) -> str:
        escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        self[value] = escaped
        return escaped


_Template = tuple[str, Callable[[Any], Any] | None]


def _template(name: str, keys: tuple[str, ...]) -> _Template:
    """``<name>{a="{}",b="{}"} {}\\n`` for the sorted label names ``keys`` (generate_latest
    sorts label pairs by name), and a getter of the label values in that order."""
    metric = escape_metric_name(name)
    if not keys:
        return f"{metric} {{}}\n", None
    order = keys
    pairs = ",".join(f'{escape_label_name(k)}="{{}}"' for k in order)
    # Escaped names hold only [a-zA-Z0-9_:] and no braces, so they are safe in a template.
    text = f"{metric}{{{{{pairs}}}}} {{}}\n"
    if len(order) == 1:
        only = order[0]
        return text, lambda labels: (labels[only],)
    return text, itemgetter(*order)



def generate_text(registry: Collector) -> bytes:
    """The registry's metrics in text format 0.0.4: ``generate_latest(registry)``."""
    output: list[str] = []
    append = output.append
    templates: dict[tuple[str, tuple[str, ...]], _Template] = {}
    escaped = _Escaped()
    esc = escaped.__getitem__
    neg_inf, inf, go_exponent_from = _NEG_INF, _INF, _GO_EXPONENT_FROM
    for metric in registry.collect():
        try:
            suffix, mtype = _TYPES.get(metric.type, ("", metric.type))
            mname = escape_metric_name(metric.name + suffix)
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n")
            special = {metric.name + s: s for s in _OM_SUFFIXES}
            om_samples: dict[str, list[str]] = {}
            # The samples of a family nearly always share one name and one label set: look
            # the template up only when they change.
            name: str | None = None
            keys: Any = None
            text, getter = "", None
            for s in metric.samples:
                labels = s.labels
                if s.name != name or labels.keys() != keys:
                    name, keys = s.name, labels.keys()
                    key = (name, tuple(sorted(labels)))
                    template = templates.get(key)
                    if template is None:
                        template = templates[key] = _template(*key)
                    text, getter = template
                d = float(s.value)
                if neg_inf < d < go_exponent_from:
                    value = repr(d)
                elif go_exponent_from <= d < inf:  # floatToGoString, inlined
                    value = repr(d)
                    dot = value.find(".")
                    if dot > 6:
                        mantissa = f"{value[0]}.{value[1:dot]}{value[dot + 1:]}".rstrip("0.")
                        value = f"{mantissa}e+{dot - 1:02d}"
                else:
                    value = _float_to_go_string(d)
                if s.timestamp is not None:
                    value = f"{value} {int(float(s.timestamp) * 1000):d}"
                if getter is None:
                    line = text.format(value)
                else:
                    line = text.format(*map(esc, getter(labels)), value)
                om = special.get(name)
                if om is None:
                    append(line)
                else:
                    om_samples.setdefault(om, []).append(line)
        except Exception as exception:
            exception.args = (exception.args or ("",)) + (metric,)
            raise
        for om, lines in sorted(om_samples.items()):
            om_name = escape_metric_name(metric.name + om)
            append(f"# HELP {om_name} {doc}\n# TYPE {om_name} gauge\n")
            output.extend(lines)
    return "".join(output).encode("utf-8")
