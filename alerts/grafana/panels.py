"""Grafana dashboard JSON as plain dictionaries: panels, queries, variables, layout.

Plain dictionaries rather than Grafana's Python builder (``grafana-foundation-sdk``):
measured and read in docs/grafana.md#how-they-are-made. The output is checked against the
JSON schemas that SDK publishes (``tests/alerts/schemas/``), panel options included, so the
schema is the same either way; what is written here is only what a panel needs, with
every required option given.

Only current panel types: ``timeseries``, ``stat``, ``table``, ``heatmap``,
``state-timeline``, ``bargauge`` (no ``graph``, ``singlestat`` or ``table-old``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]

#: Every panel and query reads the data source chosen in the ``datasource`` variable.
DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}

#: The dashboard JSON model version written (Grafana 12's; Grafana 10 and 11 import it as
#: it is, reading only the fields they know).
SCHEMA_VERSION = 41

PANEL_TYPES = frozenset({"timeseries", "stat", "table", "heatmap", "state-timeline",
                         "bargauge", "row"})


@dataclass(frozen=True)
class Query:
    """One Prometheus query of a panel: ``instant`` for a table or a value now, else a
    range query (one point per ``$__interval``). A table's queries are read as tables (a
    column per label); every other panel's as series, named by ``legend``."""

    expr: str
    legend: str = ""
    instant: bool = False

    def target(self, ref: str, as_table: bool = False) -> Json:
        out: Json = {
            "datasource": DATASOURCE,
            "refId": ref,
            "expr": self.expr,
            "editorMode": "code",
            "range": not self.instant,
            "instant": self.instant,
            "format": "table" if as_table else "time_series",
        }
        if self.legend:
            out["legendFormat"] = self.legend
        return out


@dataclass
class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping as a row fills."""

    x: int = 0
    y: int = 0
    row_height: int = 0
    next_id: int = 1
    panels: list[Json] = field(default_factory=list)

    def row(self, title: str) -> None:
        self._wrap()
        self.panels.append({"type": "row", "title": title, "collapsed": False,
                            "id": self._id(), "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def add(self, panel: Json, w: int, h: int) -> None:
        if self.x + w > 24:
            self._wrap()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _wrap(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _panel(kind: str, title: str, description: str, queries: Sequence[Query],
           options: Json, defaults: Json, *, transformations: Sequence[Json] = (),
           overrides: Sequence[Json] = ()) -> Json:
    assert kind in PANEL_TYPES, kind
    out: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [q.target(chr(ord("A") + i), as_table=kind == "table")
                    for i, q in enumerate(queries)],
        "options": options,
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
    }
    if transformations:
        out["transformations"] = list(transformations)
    return out


def _legend(show: bool = True, placement: str = "bottom") -> Json:
    return {"showLegend": show, "displayMode": "list", "placement": placement, "calcs": []}


def _thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute",
            "steps": [{"value": v, "color": c} for v, c in steps]}


#: Green below the idle line is wrong for utilization: low is the finding, so low is red.
UTILIZATION_STEPS = _thresholds((None, "red"), (0.05, "orange"), (0.5, "green"))


def stat(title: str, description: str, query: Query, *, unit: str = "none",
         no_value: str = "0", decimals: int | None = None, text_mode: str = "value",
         color: str = "text") -> Json:
    defaults: Json = {"unit": unit, "noValue": no_value,
                      "color": {"mode": "fixed", "fixedColor": color}}
    if decimals is not None:
        defaults["decimals"] = decimals
    options = {
        "graphMode": "none", "colorMode": "value", "justifyMode": "auto",
        "textMode": text_mode, "wideLayout": True, "showPercentChange": False,
        "percentChangeColorMode": "standard", "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }
    return _panel("stat", title, description, [query], options, defaults)


def timeseries(title: str, description: str, queries: Sequence[Query], *,
               unit: str = "none", min_value: float | None = None,
               max_value: float | None = None, stack: bool = False) -> Json:
    defaults: Json = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
                   "showPoints": "never", "spanNulls": False,
                   "stacking": {"mode": "normal" if stack else "none", "group": "A"}},
    }
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    options = {"legend": _legend(placement="right"),
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return _panel("timeseries", title, description, queries, options, defaults)


def table(title: str, description: str, queries: Sequence[Query],
          columns: Mapping[str, str], *, hide: Sequence[str] = (),
          units: Mapping[str, str] | None = None, sort_by: str | None = None) -> Json:
    """A table of instant queries, merged into one row per label set. ``columns`` renames
    fields (``Value #A`` is the value of query A), ``hide`` drops them, ``units`` sets a
    unit per (renamed) column."""
    exclude = {"Time": True, "__name__": True, **{name: True for name in hide}}
    transformations = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": exclude,
                                       "renameByName": dict(columns)}},
    ]
    overrides = [
        {"matcher": {"id": "byName", "options": name},
         "properties": [{"id": "unit", "value": unit}]}
        for name, unit in (units or {}).items()
    ]
    # A node or workload in a row opens its dashboard, keeping the time range, the source
    # and the clusters chosen (`:queryparam` writes `var-cluster=a&var-cluster=b`, or
    # `$__all`; a plain `${cluster}` in a link writes several values as one, `{a,b}`).
    for column, uid, variable in (("node", "gpuscope-node", "node"),
                                  ("workload", "gpuscope-workload", "workload")):
        url = (f"/d/{uid}/{uid}?${{__url_time_range}}&var-datasource=${{datasource}}"
               f"&${{cluster:queryparam}}&var-{variable}=${{__value.raw}}")
        overrides.append({"matcher": {"id": "byName", "options": column}, "properties": [
            {"id": "links", "value": [{"title": f"Open the {variable} dashboard",
                                       "url": url}]}]})
    options: Json = {"frameIndex": 0, "showHeader": True, "cellHeight": "sm",
                     "footer": {"show": False, "reducer": ["sum"], "fields": [],
                                "countRows": False}}
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": True}]
    defaults: Json = {"custom": {"align": "auto", "filterable": True, "inspect": False}}
    return _panel("table", title, description, queries, options, defaults,
                  transformations=transformations, overrides=overrides)


def heatmap(title: str, description: str, query: Query, *, unit: str = "percentunit") -> Json:
    """One row per series (no bucketing by Grafana): a node x time grid of a ratio."""
    options: Json = {
        "calculate": False,
        "rowsFrame": {"layout": "auto"},
        "color": {"mode": "scheme", "scheme": "RdYlGn", "fill": "dark-orange",
                  "scale": "linear", "exponent": 0.5, "steps": 64, "reverse": False,
                  "min": 0, "max": 1},
        "cellGap": 1,
        "showValue": "never",
        "yAxis": {"axisPlacement": "left", "reverse": False},
        "cellValues": {"unit": unit, "decimals": 0},
        "legend": {"show": True},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        # Grafana's default hides cells <= 1e-9, which would blank the idle cells, the
        # ones this heatmap is for: hide only what cannot occur (a negative ratio).
        "filterValues": {"le": -1},
    }
    defaults: Json = {"unit": unit, "custom": {"scaleDistribution": {"type": "linear"}}}
    return _panel("heatmap", title, description, [query], options, defaults)


def state_timeline(title: str, description: str, query: Query,
                   states: Sequence[tuple[int, str, str]]) -> Json:
    """A row per series, coloured by ``states`` (value, text, colour)."""
    mappings = [{"type": "value", "options": {
        str(value): {"text": text, "color": color, "index": i}
        for i, (value, text, color) in enumerate(states)}}]
    defaults: Json = {
        "color": {"mode": "thresholds"},
        "thresholds": _thresholds((None, "transparent")),
        "mappings": mappings,
        "custom": {"fillOpacity": 80, "lineWidth": 0, "spanNulls": False},
    }
    options: Json = {"showValue": "never", "rowHeight": 0.9, "mergeValues": True,
                     "alignValue": "left", "legend": _legend(),
                     "tooltip": {"mode": "single", "sort": "none"}}
    return _panel("state-timeline", title, description, [query], options, defaults)


def bargauge(title: str, description: str, query: Query, *, unit: str = "percentunit",
             max_value: float | None = 1.0, steps: Json | None = None) -> Json:
    """One bar per series: the value over the whole time range (the query computes it)."""
    defaults: Json = {"unit": unit, "min": 0, "color": {"mode": "thresholds"},
                      "thresholds": steps or UTILIZATION_STEPS}
    if max_value is not None:
        defaults["max"] = max_value
    options: Json = {
        "displayMode": "basic", "valueMode": "color", "namePlacement": "left",
        "showUnfilled": True, "sizing": "auto", "minVizWidth": 8, "minVizHeight": 16,
        "maxVizHeight": 300, "orientation": "horizontal",
        "legend": _legend(show=False),
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }
    return _panel("bargauge", title, description, [query], options, defaults)


def datasource_variable() -> Json:
    return {"type": "datasource", "name": "datasource", "label": "Data source",
            "query": "prometheus", "refresh": 1, "hide": 0, "includeAll": False,
            "multi": False, "regex": "", "options": [],
            "current": {"text": "default", "value": "default"}}


def query_variable(name: str, label: str, query: str, *, multi: bool = True,
                   include_all: bool = True, description: str = "") -> Json:
    """A variable listing the values of a label (``label_values(...)``), refreshed when
    the time range changes; "All" is ``.*`` (also matching series without the label)."""
    out: Json = {
        "type": "query", "name": name, "label": label, "description": description,
        "datasource": DATASOURCE,
        "query": query, "definition": query, "refresh": 2, "sort": 7, "hide": 0, "regex": "",
        "multi": multi, "includeAll": include_all, "options": [],
        "current": ({"text": "All", "value": "$__all"} if include_all
                    else {"text": "", "value": ""}),
    }
    if include_all:
        out["allValue"] = ".*"
    return out


def dashboard(uid: str, title: str, description: str, layout: Layout,
              variables: Sequence[Json], *, time_from: str = "now-6h",
              links: Sequence[Json] = ()) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpuscope", "gpu"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "templating": {"list": list(variables)},
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "links": list(links),
        "panels": layout.panels,
    }


def links_to(tag: str = "gpuscope") -> list[Json]:
    """A drop-down of the other gpuscope dashboards, keeping the time range and variables."""
    return [{"title": "gpuscope", "type": "dashboards", "tags": [tag], "asDropdown": True,
             "icon": "external link", "tooltip": "", "url": "", "targetBlank": False,
             "includeVars": True, "keepTime": True}]
