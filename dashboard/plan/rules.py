"""The ``gpuscope-dashboard`` recording rules (:func:`recording_rules`, :func:`rules_yaml`),
composed of the per-step signals (:class:`~gpuscope.dashboard.data.recorded.Steps`) and of
each verdict module's PromQL form (``dashboard/verdicts/``: idle, spinning, allocated-idle,
stragglers; a verdict the registry judges declares its step queries and their recorded form
there too, and is recorded here only where it is: ``uuid:gpu_throttle_any_ratio:rate2m``)."""

from __future__ import annotations

import textwrap

from gpuscope.dashboard.data.prometheus import CLUSTER_LABEL
from gpuscope.dashboard.data.promql import duration, labelled, scoped, selector
from gpuscope.dashboard.data.recorded import (
    CBY,
    GBY,
    GROUP,
    MEMBER,
    NOT_EMPTY,
    RULE_INTERVAL,
    RULE_R,
    RULE_RR,
    RULES,
    RULES_VERSION,
    Steps,
)
from gpuscope.dashboard.verdicts import (
    Thresholds,
    allocated,
    idle,
    registry,
    spinning,
    stragglers,
)
from gpuscope.dashboard.verdicts.mig import compute_slices_promql
from gpuscope.dashboard.verdicts.runs import runs_since

__all__ = ["CBY", "GBY", "GROUP", "MEMBER", "NOT_EMPTY", "RULES", "RULES_VERSION",
           "RULE_INTERVAL", "RULE_R", "RULE_RR", "Steps", "print_rules_command", "raw_note",
           "recording_rules", "rules_yaml"]


def _stat(expr: str, name: str) -> str:
    """One part of a query of several, its rows labelled ``stat="name"``."""
    return labelled(expr, "stat", name)


#: The window whose containers the rules describe (the page's default, an hour): over it the
#: page reads who uses what on the nodes that need it only (:meth:`PrometheusData.lean`).
#: The page reads the last minute recorded, up to a minute before its end: a container
#: seen only in that last minute, or only in the window's first, is missed there (too
#: short for any verdict; a device shared only then lacks its row in the shares' table).
LEAN_WINDOW = 3600.0
#: How far outside the input-starved range a container's recorded mean may be and still be
#: asked about: the recorded hour and the page's differ by at most a minute at each end and
#: a sample on the boundary, 3 samples of 60 at a one-minute scrape, so the means by at most
#: 0.05. The page judges the exact mean of its own window. A mean of 0 is never asked about
#: (strictly above the bound): an hour at exactly 0 is not input-starved a minute later.
INPUT_MARGIN = 0.05

def recording_rules(thresholds: Thresholds | None = None, cluster: str = CLUSTER_LABEL
                    ) -> list[tuple[str, str]]:
    """The ``gpuscope-dashboard`` group, ``(record, expr)`` in evaluation order: the raw
    expressions of :class:`Steps` and of the verdict modules' PromQL forms over one minute
    (two for rates),
    the sparse verdicts computed from the dense signals recorded before them, every node
    keyed by ``cluster`` too (:func:`~gpuscope.dashboard.data.promql.scoped`). The version
    series says which thresholds and cluster label the rules were made for. The rule file
    holds the same text for the defaults (a test keeps the two equal)."""
    th = thresholds or Thresholds()
    raw = Steps(RULE_R, RULE_RR)
    rec = Steps(RULE_R, RULE_RR, rules=True)
    rules = [
        (RULES["util_max"], raw.util_max()),
        (RULES["util"], raw.util()),
        (RULES["sm"], raw.active("sm")),
        (RULES["tensor"], raw.active("tensor")),
        (RULES["dram"], raw.active("dram")),
        (RULES["power"], raw.power()),
        (RULES["cutil"], raw.cutil()),
        (RULES["workload"], rec.workload(compute=True)),
        (RULES["idle"], " or ".join(idle.idle_promql(rec, th))),
        (RULES["spin"], spinning.spinning_promql(rec, th)),
        (RULES["throttling"], stragglers.throttling_promql(raw)),
        (RULES["silent"], idle.silent_promql(raw)),
        (RULES["held_idle"], " or ".join(allocated.held_idle_promql(rec, th))),
        (RULES["candidates"], stragglers.candidates_promql(rec, th)),
        (RULES["stalled_median"], stragglers.stalled_median_promql(rec)),
        (RULES["stalled"], stragglers.stalled_promql(rec, th)),
        (RULES["group_work"], stragglers.group_work_promql(rec)),
        (RULES["work_median"], stragglers.work_median_promql(rec, th)),
        (RULES["slow"], stragglers.slow_promql(rec, th)),
        (RULES["held_share"], raw.held_share()),
        (RULES["idle_held"], idle.idle_held_promql(rec)),
        (RULES["held"], rec.holdings()),
        (RULES["used"], rec.holdings(used=True)),
        (RULES["node_gpus"], f"count by (node) ({WHOLE_GPUS})"),
        (RULES["node_models"], "count by (node, model) (max by (node, uuid, model) "
                               f"(max_over_time(gpu_info[{RULE_R}])))"),
        (RULES["node_util_sum"], f"sum by (node) ({_whole_util(rec)})"),
        (RULES["node_util_count"], f"count by (node) ({_whole_util(rec)})"),
        (RULES["cmean"],
         f"avg by ({CBY}) (avg_over_time({CUTIL}[{duration(LEAN_WINDOW)}]))"),
        (RULES["input_range"], f"{_cmean()} > {max(0.0, th.input_low - INPUT_MARGIN)!r}"
                               f" <= {th.input_high + INPUT_MARGIN!r}"),
        (RULES["sharers"], f"count by (node, uuid) ({_cmean()}) >= 2"),
        (RULES["mig_slices"], compute_slices_promql()),
        (RULES["alloc_share"], allocated.share_promql(duration(LEAN_WINDOW))),
        # Each verdict's runs as they go, after the flags they follow (each reads its own
        # record of the minute before: dashboard/verdicts/runs.py).
        *[rule for run in RUNS for rule in run.rules()],
        *idle.node_run_rules(),
        (RULES["group_gpus"], stragglers.group_gpus_promql(duration(LEAN_WINDOW))),
        (RULES["runs_since"], runs_since()),
        (RULES["version"],
         f'label_replace(label_replace(vector({RULES_VERSION}), "thresholds", "{th.key}", "",'
         f' ""), "cluster_label", "{cluster}", "", "")'),
    ]
    # Every node its cluster's, where the store holds several (an absent label groups as
    # before: one cluster's rules record what they did).
    return [(record, scoped(expr, cluster)) for record, expr in rules]


#: The verdicts whose runs the rules record as they go (:mod:`~gpuscope.dashboard.verdicts.
#: runs`), in the order of their records.
RUNS = (idle.run_rule(), spinning.run_rule(), allocated.run_rule(), *stragglers.run_rules())

#: Every container's utilization of a device (the raw gauge).
CUTIL = selector("container_gpu_utilization_ratio", {"namespace": NOT_EMPTY})


def _cmean() -> str:
    """The recorded containers' means, as the rules after it read them."""
    return f"max by ({CBY}) (last_over_time({RULES['cmean']}[{RULE_R}]))"


#: Each whole GPU once (a GPU in MIG mode too; not its slices), by node and uuid, seen in the
#: minute (``max_over_time``), not as ``gpu_info`` stands at its end: a failed scrape's
#: staleness marker hides every series of the node there, and the node had no GPUs, models
#: or utilization for the minute (a page ending then counted none of them, and its hour of
#: presence lost a minute).
WHOLE_GPUS = f'max by (node, uuid) (max_over_time(gpu_info{{parent_uuid=""}}[{RULE_R}]))'


def _whole_util(st: Steps) -> str:
    """Each whole GPU's mean utilization in the step, by node and uuid (a NaN left out: the
    page's device means leave it out too)."""
    return f"(max by (node, uuid) ({st.util()}) >= 0) and on (node, uuid) {WHOLE_GPUS}"


#: The most nodes whose page the raw series (without the recording rules) give within
#: item 6's bounds on both stores, 2 s server-side and 3 s in a browser: 250 nodes, 1.85 s
#: and 2.68 s on Prometheus; at 500 nodes Prometheus takes 4.3 s, at 1,000 9.4 s
#: (docs/benchmarks.md, "Without the recording rules"). Beyond it the page says how to load
#: the rules.
RAW_NODES = 250
RAW_NOTE = ("This fleet has {nodes:,} nodes: without the gpuscope-dashboard recording rules the "
            "page reads every device's raw series, which grows slow beyond {most:,} nodes. Load "
            "the rules made for this page's thresholds into your Prometheus or vmalert "
            "({command} prints them; docs/dashboard.md, \"Recording rules\").")


def print_rules_command(thresholds: Thresholds | None = None,
                        cluster: str = CLUSTER_LABEL) -> str:
    """The ``gpuscope-dashboard --print-rules`` command line that prints the rules a page
    of ``thresholds`` and ``cluster`` label reads: every threshold that is not its default,
    and the cluster label, as flags (rules printed for other thresholds carry another
    ``thresholds`` key, and the page does not read them)."""
    th = thresholds or Thresholds()
    default = Thresholds()
    words = ["gpuscope-dashboard", "--print-rules"]
    if cluster != CLUSTER_LABEL:
        words.append(f"--cluster-label {cluster}")
    for spec in registry.THRESHOLDS:
        value = getattr(th, spec.field)
        if value != getattr(default, spec.field):
            words.append(f"{spec.flag} {spec.text(value)}")
    return " ".join(words)


def raw_note(nodes: int, most: int = RAW_NODES, thresholds: Thresholds | None = None,
             cluster: str = CLUSTER_LABEL) -> str:
    """The page's line for a fleet of ``nodes`` above ``most`` (:data:`RAW_NODES`) read
    without the rules, naming the command that prints the rules this page reads."""
    return RAW_NOTE.format(nodes=nodes, most=most,
                           command=print_rules_command(thresholds, cluster))


def rules_yaml(thresholds: Thresholds | None = None, cluster: str = CLUSTER_LABEL) -> str:
    """The ``gpuscope-dashboard`` group as it stands in alerts/gpuscope-rules.yaml (each
    expression folded to 88 columns): ``gpuscope-dashboard --print-rules`` prints it for
    its thresholds and cluster label."""
    out = ["  - name: gpuscope-dashboard", "    interval: 1m", "    rules:"]
    for record, expr in recording_rules(thresholds, cluster):
        out += [f"      - record: {record}", "        expr: >-",
                textwrap.indent(textwrap.fill(expr, 88, break_long_words=False,
                                              break_on_hyphens=False), " " * 10)]
    return "\n".join(out) + "\n"

