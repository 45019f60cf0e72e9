"""Links between the page's parts: the page URL carries its state (window, namespace,
cluster, node, pod, workload), and a table row's link to a node, pod or workload keeps the
window, namespace and cluster and scrolls to the section it opens. Pure (no Dash), so that
a verdict's table rows (:mod:`gpuscope.dashboard.verdicts`) can link what they name."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from gpuscope.dashboard import ids
from gpuscope.dashboard.data.promql import node_parts

#: Query parameters of the page URL, in the order a link writes them.
URL_KEYS = ("window", "namespace", "cluster", "node", "pod", "workload")
#: The page section each kind of link opens.
SECTIONS = {"node": ids.SECTION_NODE, "pod": ids.SECTION_POD, "workload": ids.SECTION_WORKLOAD}


def query_string(state: Mapping[str, str | None]) -> str:
    """``?window=1h&node=...`` of the non-empty values, in :data:`URL_KEYS` order."""
    items = [(k, state[k]) for k in URL_KEYS if state.get(k)]
    return "?" + urllib.parse.urlencode(items) if items else ""


def parse_query(search: str | None) -> dict[str, str]:
    """The page's state from ``location.search`` (unknown keys and repeats dropped; the
    values are validated where they are used)."""
    if not isinstance(search, str):
        return {}
    parsed = urllib.parse.parse_qs(search.lstrip("?"), keep_blank_values=False)
    return {k: v[0] for k, v in parsed.items() if k in URL_KEYS and v}


def link(text: str, state: Mapping[str, str | None], **target: str) -> str:
    """A markdown link to ``target`` (``node=``, ``pod=`` or ``workload=``) keeping the
    window, namespace and cluster of ``state``; the link scrolls to the section it opens."""
    kind = next(iter(target))
    href = query_string({"window": state.get("window"), "namespace": state.get("namespace"),
                         "cluster": state.get("cluster"), **target}) + "#" + SECTIONS[kind]
    label = text.replace("[", "(").replace("]", ")")
    return f"[{label}]({href.replace(')', '%29').replace(' ', '%20')})"


def in_cluster(state: Mapping[str, str | None], cluster: str) -> Mapping[str, str | None]:
    """``state`` for a row of ``cluster``'s: where the page shows every cluster (no cluster
    picked), a pod or workload link names the row's cluster, or it would open the pod or run
    of that name in every cluster (a node's key names its cluster itself)."""
    return state if state.get("cluster") or not cluster else {**state, "cluster": cluster}


def at_node(state: Mapping[str, str | None], node: str) -> Mapping[str, str | None]:
    """:func:`in_cluster` for a row on ``node`` (a ``cluster/node`` key, or a bare name)."""
    return in_cluster(state, node_parts(node)[0])


def node_link(node: str, state: Mapping[str, str | None]) -> str:
    return link(node, state, node=node)


def pod_link(namespace: str, pod: str, state: Mapping[str, str | None],
             text: str | None = None) -> str:
    return link(text or pod, state, pod=f"{namespace}/{pod}")


def workload_link(namespace: str, workload: str, state: Mapping[str, str | None]) -> str:
    return link(workload, state, workload=f"{namespace}/{workload}") if workload else ""
