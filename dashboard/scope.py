"""The cluster picker's scope: a page's data and step answers cut to one cluster's nodes,
before any verdict judges them, so that every section, KPI and total is that cluster's.

A node's key is ``cluster/node`` where the store holds several clusters
(:func:`~gpuscope.dashboard.data.promql.node_key`), the bare name where it holds one (its
cluster is then ""). Every key of :class:`~gpuscope.dashboard.series.FleetData` names its node
first (a node name, or a :class:`~gpuscope.dashboard.series.GpuRef`,
:class:`~gpuscope.dashboard.series.ContainerRef`, :class:`~gpuscope.dashboard.series.PodKey`,
:class:`~gpuscope.dashboard.series.HoldingKey`: named tuples whose first field is the node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.series import FleetData, HeldSteps, Runs, WorkSignals
from gpuscope.dashboard.verdicts.page import StepAnswers


def cluster_of(key: Any) -> str:
    """The cluster of a node key, or of a key whose first field is one ("" for none)."""
    node = key if isinstance(key, str) else key[0]
    return node_parts(node)[0]


def clusters(nodes: Iterable[str]) -> tuple[str, ...]:
    """The clusters of these node keys, sorted ("" left out: a store of one cluster)."""
    return tuple(sorted({c for n in nodes if (c := node_parts(n)[0])}))


def _cut(value: Any, cluster: str) -> Any:
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if cluster_of(k) == cluster}
    if isinstance(value, frozenset):
        return frozenset(k for k in value if cluster_of(k) == cluster)
    if isinstance(value, Runs):
        # A straggler group's key begins with its cluster, not a node.
        return replace(value, idle=_cut(value.idle, cluster), held=_cut(value.held, cluster),
                       spinning=_cut(value.spinning, cluster),
                       held_idle=_cut(value.held_idle, cluster),
                       stragglers={k: v for k, v in value.stragglers.items()
                                   if k[0] == cluster})
    if isinstance(value, (WorkSignals, HeldSteps)):
        return replace(value, **{f.name: _cut(getattr(value, f.name), cluster)
                                 for f in fields(value)})
    return value


def scoped_data(data: FleetData, cluster: str) -> FleetData:
    """``data`` of ``cluster``'s nodes only. The straggler groups the store counted
    fleet-wide (``workloads_checked``) are counted again by the analysis, in the
    containers it has."""
    keyed = {f.name: _cut(getattr(data, f.name), cluster) for f in fields(data)
             if f.name not in ("window", "history_start", "queries", "notes",
                               "workloads_checked")}
    return replace(data, **keyed, workloads_checked=None)


def scoped_steps(steps: StepAnswers, cluster: str) -> StepAnswers:
    """The step queries' series of ``cluster``'s nodes only."""
    return {q: [(lab, s) for lab, s in rows if cluster_of(lab.get("node", "")) == cluster]
            for q, rows in steps.items()}
