"""PromQL built safely: every user-given value is validated (:mod:`.source`) *and* escaped here
before it reaches a query, and every regex alternative is escaped twice (regex, then string)."""


from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The same as one table for str.translate (one pass in C: the fleet page escapes node lists of
# some 10^5 characters): the escapes above, every other control character as \uXXXX.
_TRANSLATE = str.maketrans({**{chr(c): f"\\u{c:04x}" for c in [*range(0x20), 0x7F]},
                            **_ESCAPES})


def escape_label_value(value: str) -> str:
    """``value`` as the inside of a double-quoted PromQL string literal.

    Backslash and double quote are escaped, newline/CR/tab get their escapes and every other
    control character ``\\uXXXX``, so no input can close the literal and append PromQL.
    """
    return value.translate(_TRANSLATE)


def selector(metric: str, matchers: Mapping[str, str] | None = None, **equal: str) -> str:
    """``metric{label="value", ...}`` with every value escaped.

    ``matchers`` maps label names to raw PromQL matcher suffixes built by this module only
    (e.g. ``'!=""'``); ``equal`` are user-facing equality matchers, escaped here.
    """
    if not _METRIC_NAME.match(metric):
        raise ValueError(f"bad metric name {metric!r}")
    parts = []
    for name, op in (matchers or {}).items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f"{name}{op}")
    for name, value in equal.items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f'{name}="{escape_label_value(value)}"')
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric



# RE2's metacharacters outside a character class. "-" is not one: it means a range only inside
# "[...]", which no value can open ("[" is escaped). It stays bare on purpose: Prometheus
# answers a list of literal alternatives from its index (tsdb's findSetMatches) only when
# every escape is of one of these, and gives up on "\-", then runs the regex over every value
# of the label (at 5,000 nodes, whose names all have hyphens: 15 % more store CPU for the
# second round's node lists, docs/benchmarks.md, ninth pass).
_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_REGEX_ESCAPES = str.maketrans({ch: "\\" + ch for ch in _REGEX_SPECIAL})


def any_of(values: Sequence[str]) -> str:
    """A PromQL regex matcher body (already escaped for the string literal) matching exactly
    one of ``values``: regex metacharacters escaped first, then the literal escaping."""
    return escape_label_value("|".join(v.translate(_REGEX_ESCAPES) for v in values))


def duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def seconds(d: str) -> float:
    """The seconds of a duration :func:`duration` wrote (``"3600s"``, ``"119999ms"``)."""
    return int(d[:-2]) / 1000 if d.endswith("ms") else float(int(d.removesuffix("s")))


def summed_rate(sel: str, r: str, by: str) -> str:
    """A counter's mean rate per second over ``r`` (a :func:`duration`), aggregated ``by``:
    each exporter pod's increase (``instance``; an HA pair's or a second job's copies of one
    pod counted once), summed over the pods, over ``r``. Across a rollout the new pod, on a
    new address, counts from 0 and each pod covers only its part of the range: their
    largest rate read the device low for a step (Prometheus divides by the whole range), and
    their summed rates read it high on VictoriaMetrics (which divides each by its own
    samples' span); the summed increases over the range read the same on both, the gap's
    part left out. At a steady rate it is ``rate()``: Prometheus' ``rate`` is its
    ``increase`` over the range, and VictoriaMetrics' increase of regular samples spans the
    range."""
    return f"(sum by ({by}) (max by ({by}, instance) (increase({sel}[{r}]))) / {seconds(r)!r})"


def labelled(expr: str, label: str, value: str) -> str:
    """``expr`` with ``label`` set to ``value`` on every series (``label_replace`` from no
    source label): how one query of several parts tells its rows apart. ``value`` escaped."""
    return f'label_replace({expr}, "{label}", "{escape_label_value(value)}", "", "")'


# -- clusters ---------------------------------------------------------------------------------

#: Between a node's cluster and its name in the dashboard's node key: ``prod-a/ip-10-0-1-23``.
#: A node name is a DNS subdomain and never holds it; a node without a cluster label keeps
#: its bare name (one cluster: nothing changes).
CLUSTER_SEP = "/"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|on)(\s*)\(([^()]*)\)")


def node_key(cluster: str, node: str) -> str:
    """The dashboard's key of ``node`` in ``cluster`` (``cluster/node``; the bare name when
    ``cluster`` is empty)."""
    return f"{cluster}{CLUSTER_SEP}{node}" if cluster else node


def node_parts(key: str) -> tuple[str, str]:
    """``(cluster, node)`` of a node key (``""`` for a bare name)."""
    cluster, sep, node = key.rpartition(CLUSTER_SEP)
    return (cluster, node) if sep else ("", key)


#: Where an answer's series of no node (a workload's, a straggler group's) keeps its
#: cluster (a series of a node has it in its node key).
GROUP_CLUSTER = "cluster"


def cluster_of_series(labels: Mapping[str, str]) -> str:
    """The cluster of a store's answer's series: its node key's, else
    :data:`GROUP_CLUSTER`'s ("" in a store of one cluster)."""
    node = labels.get("node")
    return node_parts(node)[0] if node else labels.get(GROUP_CLUSTER, "")


#: The labels whose values are a cluster's own: a node, and a workload (a job of one name
#: runs in several clusters: each cluster's is a run of its own, and its straggler group).
CLUSTER_KEYED = frozenset({"node", "workload"})


def scoped(promql: str, cluster: str) -> str:
    """``promql`` with the label ``cluster`` in every ``by (...)`` and ``on (...)`` list that
    names ``node`` or ``workload`` (:data:`CLUSTER_KEYED`: ``max by (cluster, node, gpu,
    uuid)``, ``and on (cluster, node, uuid)``, ``quantile by (cluster, namespace, workload,
    model)``): each node and each workload is its cluster's, where a store holds several
    clusters under that label (an absent label is an empty value: one cluster's data
    groups as before). String literals are left as they are."""
    if not _LABEL_NAME.match(cluster):
        raise ValueError(f"bad label name {cluster!r}")

    def add(m: re.Match[str]) -> str:
        labels = [label.strip() for label in m.group(3).split(",")]
        if CLUSTER_KEYED.isdisjoint(labels) or cluster in labels:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}({cluster}, {m.group(3).strip()})"

    out, last = [], 0
    for literal in _STRING.finditer(promql):
        out += [_GROUPING.sub(add, promql[last:literal.start()]), literal.group(0)]
        last = literal.end()
    out.append(_GROUPING.sub(add, promql[last:]))
    return "".join(out)


def node_matchers(keys: Sequence[str], cluster: str) -> dict[str, str]:
    """The matchers of the nodes ``keys`` (node keys, :func:`node_key`): ``node=~"a|b"`` and
    ``cluster=~"c1|c2"`` (``""`` among them for a bare name: the series without the label;
    one shape whatever the names). A node of one cluster may bring the same name of another
    along; its answers are keyed apart."""
    parts = [node_parts(k) for k in keys]
    return {"node": f'=~"{any_of(sorted({n for _, n in parts}))}"',
            cluster: f'=~"{any_of(sorted({c for c, _ in parts}))}"'}


def node_equal(key: str, cluster: str) -> dict[str, str]:
    """The matchers of one node (its key, :func:`node_key`): ``node="n"`` and its cluster
    ``cluster="c"`` (``cluster=""`` for a bare name: the series without one)."""
    c, node = node_parts(key)
    return {"node": f'="{escape_label_value(node)}"', cluster: f'="{escape_label_value(c)}"'}
