"""The rule file as the dashboards' source of queries, and the price rules made from the
dashboard's price table.

Panels never spell out a verdict: they take the expression of a recording or alerting rule
by name (:meth:`Rules.expr`), or use a recorded series, so a change to
``alerts/gpuscope-rules.yaml`` changes the dashboards (and ``--check`` fails until they are
regenerated).

Idle dollars need a price per node. No metric carries one, and gpuscope's exporter knows
only the node's instance type (``gpu_node_info``). The group ``gpuscope-grafana`` at the end
of the rule file holds one recording rule per instance type of ``dashboard/prices.yaml``
(the dated on-demand table the gpuscope dashboard uses: ``vector(price)`` with the instance
type, provider, region and price date as labels), and the node and per-GPU prices joined
from them. It is generated, like the dashboards, by ``python -m gpuscope.alerts.grafana``;
an instance type with no price has no price series, so it is left out of dollar sums
(never counted as $0). A node is (cluster, node), as in the alerting rules; ``max by``
counts a node once however many HA replicas' copies of ``gpu_node_info`` a store holds.

Only ``gpu_node_info`` carries the exporter's ``--cluster-name`` (``exporter/metrics.py``);
the store's cluster label (an external label) is on every series or on none. So the two may
disagree: ``gpu_node_info`` with a cluster and the node's other series without (a cluster's
own Prometheus, or a store of many clusters without external labels), or the other way
round. :func:`node_info` keys the node's ``gpu_node_info`` as its ``gpu_exporter_nvml_up``
is keyed, which is how every other rule keys the node, and gives each node one row.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuscope.alerts.render import RULES_FILE, RenderError, dump_yaml, load_rules
from gpuscope.dashboard.prices import PriceTable

GROUP = "gpuscope-grafana"

#: Recorded series of the generated group.
INSTANCE_PRICE = "instance_type:gpu_node_price_dollars_per_hour:on_demand"
NODE_PRICE = "node:gpu_node_price_dollars_per_hour:on_demand"
DEVICE_PRICE = "node:gpu_device_price_dollars_per_hour:on_demand"

#: The lines that open and close the generated group; what is between them is rewritten by
#: the generator, and nothing else.
MARKER = (
    "  # ---- gpuscope-grafana: generated from dashboard/prices.yaml by"
    " `python -m gpuscope.alerts.grafana`;"
)
END_MARKER = "  # ---- end of gpuscope-grafana (generated)\n"

_HEADER = (
    MARKER + "\n"
    "  # do not edit it up to its end line: change the price table (or the generator) and run\n"
    "  # it again. Groups of your own go above this line or below the end line.\n"
    "  # On-demand prices only: a spot node is priced on demand here (an upper bound).\n"
)


class GrafanaError(Exception):
    """A rule file or price table the generator cannot use; ``str()`` is one line."""


class Rules:
    """The rules of one rule file, by name (``record:`` or ``alert:``)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._exprs: dict[str, str] = {}
        for group in data["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule["alert"]
                # A recorded name may repeat (one price rule per instance type): the
                # dashboards use those by their series, never by their expression.
                self._exprs.setdefault(name, str(rule["expr"]).strip())

    @classmethod
    def load(cls, path: Path = RULES_FILE) -> Rules:
        try:
            return cls(load_rules(path))
        except RenderError as exc:
            raise GrafanaError(str(exc)) from None

    def expr(self, name: str) -> str:
        """The expression of the rule called ``name``, as written in the rule file."""
        try:
            return self._exprs[name]
        except KeyError:
            raise GrafanaError(f"no rule named {name!r} in the rule file") from None

    def has(self, name: str) -> bool:
        """Whether the rule file has a rule called ``name``."""
        return name in self._exprs

    def series(self, name: str) -> str:
        """``name`` as a selector, checked to be a recorded series of the rule file."""
        self.expr(name)
        return name


def node_info(labels: str) -> str:
    """``gpu_node_info``'s ``labels`` (a PromQL label list such as ``"instance_type"``), one
    row per node (value 1) keyed by the (cluster, node) of the node's
    ``gpu_exporter_nvml_up``, whichever of the two carries a cluster label.

    - Both carry the same cluster, or neither does: joined on (cluster, node).
    - Only one carries it (``gpu_node_info``'s ``--cluster-name`` with no external label on
      the store, or the reverse): the node's ``gpu_node_info`` that no
      ``gpu_exporter_nvml_up`` of its (cluster, node) matches is joined by node name to the
      ``gpu_exporter_nvml_up`` that no ``gpu_node_info`` matches, and takes its cluster.
      The clusters are moved to other labels first (``nvml_up_cluster``,
      ``node_info_cluster``): two clusters' namesake nodes are series alike but for
      ``cluster``, and blanking it in place is a "vector cannot contain metrics with the
      same labelset" error that fails the whole rule, every node's price with it.

    - No ``gpu_exporter_nvml_up`` of the node's name at all (a store fed other than by the
      exporter's scrape, as the tests' backfilled demo fleet): keyed without a cluster.

    ``topk by (cluster, node) (1, ...)``: one row per node even where its exporters disagree
    for a moment (a node replaced by another instance type of the same name), so sums over
    nodes count each once. Every ``by``/``on`` names the cluster, so the dashboards' scoping
    (:func:`~.promql.scope`) leaves the expression as it is."""
    return (
        "topk by (cluster, node) (1,\n"
        f"  max by (cluster, node, {labels}) (\n"
        "    gpu_node_info and on (cluster, node) gpu_exporter_nvml_up\n"
        "    or\n"
        "    label_replace(\n"
        "      label_replace(\n"
        "        label_replace(\n"
        "          max by (cluster, node) (\n"
        "            gpu_exporter_nvml_up unless on (cluster, node) gpu_node_info\n"
        "          ),\n"
        "          \"nvml_up_cluster\", \"$1\", \"cluster\", \"(.*)\"\n"
        "        ),\n"
        "        \"cluster\", \"\", \"\", \"\"\n"
        "      ) * 0\n"
        "      + on (cluster, node) group_left (" + labels + ")\n"
        "      topk by (cluster, node) (1,\n"
        f"        max by (cluster, node, {labels}) (\n"
        "          label_replace(\n"
        "            label_replace(\n"
        "              gpu_node_info unless on (cluster, node) gpu_exporter_nvml_up,\n"
        "              \"node_info_cluster\", \"$1\", \"cluster\", \"(.*)\"\n"
        "            ),\n"
        "            \"cluster\", \"\", \"\", \"\"\n"
        "          )\n"
        "        )\n"
        "      ),\n"
        "      \"cluster\", \"$1\", \"nvml_up_cluster\", \"(.*)\"\n"
        "    )\n"
        "    or\n"
        "    label_replace(\n"
        "      label_replace(gpu_node_info,\n"
        "                    \"node_info_cluster\", \"$1\", \"cluster\", \"(.*)\"),\n"
        "      \"cluster\", \"\", \"\", \"\"\n"
        "    )\n"
        "    unless on (cluster, node)\n"
        "    max by (cluster, node) (\n"
        "      label_replace(\n"
        "        label_replace(gpu_exporter_nvml_up,\n"
        "                      \"nvml_up_cluster\", \"$1\", \"cluster\", \"(.*)\"),\n"
        "        \"cluster\", \"\", \"\", \"\"\n"
        "      )\n"
        "    )\n"
        "  )\n"
        ")"
    )


def price_group(prices: PriceTable) -> dict[str, Any]:
    """The ``gpuscope-grafana`` rule group for ``prices``."""
    rules: list[dict[str, Any]] = []
    for p in prices.entries():
        rules.append({
            "record": INSTANCE_PRICE,
            "expr": f"vector({p.per_hour!r})",
            "labels": {"instance_type": p.instance_type, "provider": p.provider,
                       "region": p.region, "price_date": p.date},
        })
    if not rules:
        raise GrafanaError("the price table has no on-demand prices")
    rules.append({
        "record": NODE_PRICE,
        "expr": (
            f"{node_info('instance_type, capacity_type')}\n"
            "* on (instance_type) group_left (provider, region, price_date)\n"
            f"max by (instance_type, provider, region, price_date) ({INSTANCE_PRICE})\n"
        ),
    })
    rules.append({
        "record": DEVICE_PRICE,
        "expr": (
            f"max by (cluster, node) ({NODE_PRICE})\n"
            "/ on (cluster, node)\n"
            "(node:gpu_devices:count > 0)\n"
        ),
    })
    return {"name": GROUP, "rules": rules}


def price_group_text(prices: PriceTable) -> str:
    """The generated group as it stands at the end of the rule file."""
    body = dump_yaml({"groups": [price_group(prices)]})
    assert body.startswith("groups:\n")
    return _HEADER + body.removeprefix("groups:\n") + END_MARKER


def with_price_group(rules_text: str, prices: PriceTable) -> str:
    """``rules_text`` with its generated group (from :data:`MARKER` to :data:`END_MARKER`,
    or to the end of the file where that is missing) replaced by the one for ``prices``."""
    at = rules_text.find(MARKER)
    if at < 0:
        raise GrafanaError(
            f"the rule file has no line starting {MARKER.strip()[:40]!r}...: the generated "
            f"group {GROUP!r} belongs at its end")
    end = rules_text.find(END_MARKER, at)
    rest = rules_text[end + len(END_MARKER):] if end >= 0 else ""
    return rules_text[:at] + price_group_text(prices) + rest
