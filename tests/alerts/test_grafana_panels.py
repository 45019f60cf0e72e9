"""The Grafana dashboards' panels as an SRE reads them, against a real Prometheus holding the
demo fleet (the store of ``tests/alerts/test_grafana.py``): what each series is called in a
legend; the same panels on a store of two clusters, and where a table's link leads; the same
queries on VictoriaMetrics; and what a number counts (containers, a node's throttled time,
the stacked idle dollars), with a node added to the fleet where the demo has no such case.

Legends are rendered as Grafana renders them (``renderLegendFormat`` of ``@grafana/data``:
``{{label}}`` is the series' value of the label, and the label's *name* where the series
has no such label or an empty one; Prometheus leaves empty labels out of its answers).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import pytest
import requests

from gpuscope.alerts.grafana import __main__ as cli
from gpuscope.alerts.grafana.dashboards import DASHBOARDS
from gpuscope.alerts.grafana.promql import rename_label
from gpuscope.alerts.grafana.rules import DEVICE_PRICE, NODE_PRICE, Rules
from gpuscope.alerts.render import load_rules, relabel_rules
from tests.alerts.test_grafana import (
    NODE,
    VALUES,
    OpenMetricsWriter,
    _query,
    _run,
    _serve,
    dashboards,
    listed_values,
    panels,
)
from tests.alerts.test_grafana import demo_prometheus as demo_prometheus
from tests.alerts.test_grafana import demo_samples as demo_samples
from tests.stores import start_victoriametrics

_PLACEHOLDER = re.compile(r"\{\{\s*(.+?)\s*\}\}")


def legend(pattern: str, labels: dict[str, str]) -> str:
    """A series' name in a legend, as Grafana writes it."""
    return _PLACEHOLDER.sub(lambda m: labels.get(m.group(1)) or m.group(1), pattern)


def legended_targets(name: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(dashboards()[name]):
        for target in panel.get("targets", []):
            if target.get("legendFormat") and _PLACEHOLDER.search(target["legendFormat"]):
                yield panel, target


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_legend_names_its_series_by_labels_they_have(
        name: str, demo_prometheus: str) -> None:
    """Each label a legend names is on every series the query returns (a whole GPU has no
    ``mig_profile``: "GPU 0 {{mig_profile}}" read "GPU 0 mig_profile"), and no two series
    of one query share a name."""
    now = time.time()
    wrong = []
    shown_by_title: dict[str, set[str]] = {}
    for panel, target in legended_targets(name):
        wanted = set(_PLACEHOLDER.findall(target["legendFormat"]))
        for values in VALUES[name]:
            result = _run(demo_prometheus, target, values, now)
            names = [legend(target["legendFormat"], r["metric"]) for r in result]
            shown_by_title.setdefault(panel["title"], set()).update(names)
            for r, shown in zip(result, names, strict=True):
                missing = sorted(label for label in wanted if not r["metric"].get(label))
                if missing:
                    wrong.append(f"{panel['title']} / {target['refId']}: {shown!r} "
                                 f"(no {', '.join(missing)})")
            if len(names) != len(set(names)):
                wrong.append(f"{panel['title']} / {target['refId']}: names repeat: "
                             f"{sorted(n for n in set(names) if names.count(n) > 1)}")
    assert not wrong, "\n".join(sorted(set(wrong)))
    if name == "gpuscope-node":
        # A MIG slice is named with its profile, a whole GPU by its index alone.
        assert {"GPU 0", "GPU 6/1 3g.40gb"} <= shown_by_title["SM activity (GPM)"]


# ---- a store of two clusters ---------------------------------------------------------------

CLUSTERS = ("a", "b")


class _TwoClusters(OpenMetricsWriter):
    """The demo fleet twice in one store, as clusters "a" and "b" (their Prometheus servers'
    external label, ``label``): the same node names in both, as EKS clusters in eksctl's
    default VPC have."""

    def __init__(self, of: OpenMetricsWriter, clusters: tuple[str, ...] = CLUSTERS,
                 label: str = "cluster") -> None:
        super().__init__()
        self.end = of.end
        families = dict(of.families)
        # The exporter's gpu_exporter_nvml_up, which the demo's backfill does not render:
        # beside each node's gpu_node_info, as a running exporter serves them.
        families.setdefault("gpu_exporter_nvml_up", [
            "gpu_exporter_nvml_up{" + ",".join(_NODE_LABEL.findall(line)) + "} 1.0 "
            + line.rsplit(" ", 1)[1] for line in of.families["gpu_node_info"]])
        self.families = {name: [line.replace("{", f'{{{label}="{c}",', 1)
                                for c in clusters for line in lines]
                         for name, lines in families.items()}


_NODE_LABEL = re.compile(r'\b(?:instance|job|node)="[^"]*"')


@pytest.fixture(scope="module")
def cluster_stores(prometheus_bin: str, promtool: str, demo_samples: OpenMetricsWriter,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """:func:`two_clusters` and :func:`other_label_store`, started together: each store's
    rules record from when it began, and the demo's raw samples end when the session
    began, so two stores started minutes apart on a loaded machine hold different recorded
    series (those whose raw series ended within the minutes between) and could not be
    compared."""
    servers = [
        _serve(prometheus_bin, promtool, _TwoClusters(demo_samples),
               tmp_path_factory.mktemp("grafana-two-clusters"), (), timeout=240),
        # Cluster "a" alone, its cluster label called k8s_cluster, the rules rendered so.
        _serve(prometheus_bin, promtool, _TwoClusters(demo_samples, ("a",), OTHER_LABEL),
               tmp_path_factory.mktemp("grafana-other-label"), (), timeout=240,
               rules=relabel_rules(load_rules(), OTHER_LABEL))]
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            two, other = pool.map(next, servers)
        yield two, other
    finally:
        for server in servers:
            server.close()  # (GeneratorExit at its yield: its finally stops Prometheus)


@pytest.fixture(scope="module")
def two_clusters(cluster_stores: tuple[str, str]) -> str:
    """The demo fleet twice, as clusters "a" and "b" (:class:`_TwoClusters`), evaluating
    the shipped rules."""
    return cluster_stores[0]


def _keyed(result: list[dict[str, Any]], cluster: str = "") -> dict[str, dict[float, float]]:
    """Each series' points by its labels; with ``cluster``, as its cluster's own store would
    label it: no ``cluster``, and the legends' ``cluster_<label>`` (``<cluster>/<value>``)
    its value alone."""
    out: dict[str, dict[float, float]] = {}
    for r in result:
        labels = dict(r["metric"])
        if cluster:
            assert labels.pop("cluster", cluster) == cluster, labels
            for k, v in labels.items():
                if k.startswith("cluster_"):
                    assert v.startswith(f"{cluster}/"), labels
                    labels[k] = v.removeprefix(f"{cluster}/")
                if k == "named":  # the node dashboard's "<cluster>/<node> GPU 0"
                    assert v.startswith(f"{cluster}/"), labels
                    labels[k] = v.split(" ", 1)[1]
        key = json.dumps(labels, sort_keys=True)
        assert key not in out, key
        points = r["values"] if "values" in r else [r["value"]]
        out[key] = {float(t): float(v) for t, v in points}
    return out


# The first test waits for the store: twice the demo fleet, the rules evaluated over it.
@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_one_cluster_of_two_is_the_cluster_alone(name: str, demo_prometheus: str,
                                                 two_clusters: str) -> None:
    """On a store of two clusters holding the same fleet, every query with the cluster
    variable on "a" answers what it answers on that cluster's own store (its series with
    ``cluster="a"``); with both clusters chosen (Grafana's multi-value ``(a|b)``, and All),
    each series once per cluster, and every legend names each series apart (it named the
    two clusters' namesake nodes, ranks and containers alike: "ip-10-0-1-12.ec2.internal"
    twice in the heatmap). The node dashboard too: with both clusters chosen, the node name
    is both clusters' nodes, each of its numbers is one per node ("GPUs" read 16 for two
    nodes of 8) and each device is named with its cluster ("GPU 0" twice)."""
    now = time.time()
    wrong = []
    for panel in panels(dashboards()[name]):
        for target in panel.get("targets", []):
            where = f"{panel['title']} / {target['refId']}"
            alone = _keyed(_run(demo_prometheus, target, VALUES[name][0], now))
            raw = _run(two_clusters, target, {**VALUES[name][0], "cluster": "a"}, now)
            per_cluster = bool(raw) and all(r["metric"].get("cluster") == "a" for r in raw)
            if name == "gpuscope-node" and raw and not per_cluster:
                # The node dashboard with several clusters chosen holds every namesake node
                # of them: a number summed over the clusters showed two nodes as one.
                wrong.append(f"{where}: not one series per cluster: {raw[0]['metric']}")
            one = _keyed(raw, cluster="a")
            if alone.keys() != one.keys():
                wrong.append(f"{where}: cluster a {sorted(one)[:3]} != {sorted(alone)[:3]}")
                continue
            for key in alone:
                common = sorted(alone[key].keys() & one[key].keys())
                if [one[key][t] for t in common] != pytest.approx(
                        [alone[key][t] for t in common], rel=0.1, abs=1e-9):
                    wrong.append(f"{where}: {key} values differ")
            pattern = target.get("legendFormat", "")
            for chosen in ("(a|b)", ".*"):
                both = _run(two_clusters, target, {**VALUES[name][0], "cluster": chosen}, now)
                if per_cluster and len(both) != 2 * len(alone):
                    wrong.append(f"{where}: {len(both)} series for {chosen}, not 2 x "
                                 f"{len(alone)}")
                if _PLACEHOLDER.search(pattern):
                    names = [legend(pattern, r["metric"]) for r in both]
                    if len(names) != len(set(names)):
                        wrong.append(f"{where}: names repeat with {chosen}: "
                                     f"{sorted(n for n in set(names) if names.count(n) > 1)[:3]}")
    assert not wrong, "\n".join(wrong)


# ---- a store whose cluster label is called otherwise -------------------------------------

OTHER_LABEL = "k8s_cluster"


@pytest.fixture(scope="module")
def other_label_store(cluster_stores: tuple[str, str]) -> str:
    """Cluster "a" of :func:`two_clusters` alone, in a store that calls its cluster label
    ``k8s_cluster``, evaluating the rules rendered for that name (``python -m
    gpuscope.alerts.render --cluster-label k8s_cluster``). (Not a third cluster of
    ``two_clusters``: the two rule sets would each fold the other's clusters into one, and
    record the same series.)"""
    return cluster_stores[1]


def _as_cluster(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``result`` with each series' ``k8s_cluster`` label called ``cluster``."""
    out = []
    for r in result:
        metric = {("cluster" if k == OTHER_LABEL else k): v for k, v in r["metric"].items()}
        assert "cluster" not in r["metric"], r["metric"]
        out.append({**r, "metric": metric})
    return out


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_another_cluster_label_answers_as_cluster_does(name: str, two_clusters: str,
                                                      other_label_store: str) -> None:
    """The dashboards written with ``--cluster-label k8s_cluster``, on a store whose
    cluster "a" is labelled ``k8s_cluster``, answer every query as the shipped ones answer
    on the two-cluster store with ``cluster`` "a" chosen: the same series (their cluster
    under the other name) and values, each variable the same values. (Before the option
    there was no way to write them: the shipped ones list no cluster and read recorded
    series by a label they lack.)"""
    texts = cli.outputs(out_dirs=(Path("relabelled"),), cluster_label=OTHER_LABEL)
    board = json.loads(texts[Path("relabelled") / f"{name}.json"])
    values = {**VALUES[name][0], "cluster": "a"}
    now = time.time()
    wrong = []
    shipped = [t for p in panels(dashboards()[name]) for t in p.get("targets", [])]
    relabelled = [(p["title"], t) for p in panels(board) for t in p.get("targets", [])]
    assert len(shipped) == len(relabelled)
    answered = compared = 0
    for want_target, (title, target) in zip(shipped, relabelled, strict=True):
        where = f"{title} / {target['refId']}"
        want = _keyed(_run(two_clusters, want_target, values, now))
        got = _keyed(_as_cluster(_run(other_label_store, target, values, now)))
        if not want and not got and target["range"]:
            # The demo's raw samples end when the session began, and the rules recorded
            # from when each store began: on a loaded machine the overlap of the last
            # 30 minutes is gone before this test runs (as in the VictoriaMetrics test).
            continue
        compared += 1
        answered += bool(got)
        if want.keys() != got.keys():
            wrong.append(f"{where}: {sorted(got)[:2]} != {sorted(want)[:2]}")
            continue
        for key in want:
            common = sorted(want[key].keys() & got[key].keys())
            if not common or [got[key][t] for t in common] != pytest.approx(
                    [want[key][t] for t in common], rel=0.1, abs=1e-9):
                wrong.append(f"{where}: {key} values differ")
    for variable, listed, chosen in listed_values(board, other_label_store, values):
        if not listed or (chosen != ".*" and chosen not in listed):
            wrong.append(f"variable {variable}: lists {sorted(listed)[:3]}")
    assert not wrong, "\n".join(wrong)
    assert answered >= 0.8 * compared, (answered, compared)


# ---- an HA pair that evaluates the rules in both replicas ---------------------------------


def _copies(result: list[dict[str, Any]], replica: str) -> dict[str, list[dict[float, float]]]:
    """Each series' points by its labels but ``replica`` and ``__name__`` (which
    :func:`~gpuscope.alerts.grafana.promql.count_once`'s ``max`` drops): a list of one per
    copy."""
    out: dict[str, list[dict[float, float]]] = {}
    for r in result:
        labels = {k: v for k, v in r["metric"].items() if k not in (replica, "__name__")}
        points = r["values"] if "values" in r else [r["value"]]
        out.setdefault(json.dumps(labels, sort_keys=True), []).append(
            {float(t): float(v) for t, v in points})
    return out


def _one_copy(result: list[dict[str, Any]], cluster: str
              ) -> dict[str, list[dict[float, float]]]:
    """A committed query's answer with ``cluster`` chosen, keyed as :func:`_copies` keys
    one copy: no ``cluster`` or ``__name__``, the legends' ``<cluster>/`` prefixes gone
    (:func:`_keyed`)."""
    out: dict[str, list[dict[float, float]]] = {}
    for key, points in _keyed(result, cluster).items():
        labels = {k: v for k, v in json.loads(key).items() if k != "__name__"}
        out.setdefault(json.dumps(labels, sort_keys=True), []).append(points)
    return out


def _differs(want: dict[str, list[dict[float, float]]],
             got: dict[str, list[dict[float, float]]]) -> str:
    """How ``got`` differs from ``want`` (one copy of each series): '' where it does not."""
    if want.keys() != got.keys():
        return f"series {sorted(got.keys() ^ want.keys())[:2]}"
    for key, [points] in want.items():
        if len(got[key]) != 1:
            return f"{len(got[key])} copies of {key}"
        common = sorted(points.keys() & got[key][0].keys())
        if [got[key][0][t] for t in common] != pytest.approx(
                [points[t] for t in common], rel=0.1, abs=1e-9):
            return f"values of {key}: {[got[key][0][t] for t in common][-1:]} for " \
                   f"{[points[t] for t in common][-1:]}"
    return ""


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_replica_labels_count_an_ha_pair_s_copies_once(name: str, two_clusters: str) -> None:
    """The dashboards written with ``--replica-labels`` answer every query on a store
    holding two HA replicas' copies of the fleet, raw series and the rules' recorded
    series (both replicas evaluate the rules), as the committed ones answer on one copy
    (on the same store, cluster "a" chosen);
    without the flag, the panels that sum or count recorded series count each copy.

    The store is :func:`two_clusters` (no second server): the demo fleet written twice
    under ``cluster`` "a" and "b", each copy's recorded series with its own label, which is
    what an HA pair writes under its replica label. Read with ``--cluster-label
    k8s_cluster`` (a label the store lacks, as a cluster's own store lacks one),
    ``cluster`` is that replica label: ``--replica-labels cluster``."""
    plain = cli.outputs(out_dirs=(Path("plain"),), cluster_label=OTHER_LABEL)
    once = cli.outputs(out_dirs=(Path("once"),), cluster_label=OTHER_LABEL,
                       replica_labels=("cluster",))
    plain_board = json.loads(plain[Path("plain") / f"{name}.json"])
    board = json.loads(once[Path("once") / f"{name}.json"])
    values = VALUES[name][0]
    now = time.time()
    shipped = [t for p in panels(dashboards()[name]) for t in p.get("targets", [])]
    targets = [(p["title"], t) for p in panels(board) for t in p.get("targets", [])]
    # Without the flag: the committed queries, whose raw reads collapse the rules' replica
    # labels (``max without (prometheus_replica, __replica__, replica)``), that list naming
    # this store's replica label as it names ``replica``.
    plain_targets = [{**t, "expr": rename_label(t["expr"], "replica", "cluster")}
                     for p in panels(plain_board) for t in p.get("targets", [])]
    assert len(shipped) == len(targets) == len(plain_targets)
    wrong, counted_twice = [], []
    compared = answered = 0
    for want_target, (title, target), plain_target in zip(shipped, targets, plain_targets,
                                                          strict=True):
        where = f"{title} / {target['refId']}"
        # (One copy: the committed query with cluster "a" chosen, on the same store, so
        # both sides read rules recorded from the same start: a store started minutes
        # later on a loaded machine records nothing for series that ended before that.)
        want = _one_copy(_run(two_clusters, want_target, {**values, "cluster": "a"}, now),
                         "a")
        got = _copies(_run(two_clusters, target, values, now), "cluster")
        if not want and not got and target["range"]:
            continue  # the raw samples and the recorded ones no longer overlap (as above)
        compared += 1
        answered += bool(got)
        if differs := _differs(want, got):
            wrong.append(f"{where}: {differs}")
        try:
            differs = _differs(want, _copies(_run(two_clusters, plain_target, values, now),
                                             "cluster"))
        except AssertionError as exc:  # a join that finds two copies on one side
            differs = "refused: " + str(exc).split("error\": \"", 1)[-1][-100:]
        if differs:
            counted_twice.append(f"{where}: {differs}")
    assert not wrong, "\n".join(wrong)
    assert answered >= 0.8 * compared, (answered, compared)
    print(f"{name}: without --replica-labels, {len(counted_twice)} of {compared} queries "
          "count the copies:\n  " + "\n  ".join(counted_twice))
    assert counted_twice


# ---- drill-down links ----------------------------------------------------------------------


def follow(url: str, variables: dict[str, list[str]], value: str) -> dict[str, list[str]]:
    """The ``var-`` parameters of a table cell's link, interpolated as Grafana interpolates
    a data link (``getLinkModel``: ``replaceVariables(href, vars, VariableFormatID.UriEncode)``,
    formats of ``formatRegistry``): ``${name}`` percent-encodes one value and writes several
    as ``{a,b}``; ``${name:queryparam}`` writes ``var-name=a&var-name=b``."""
    def one(m: re.Match[str]) -> str:
        name, fmt = m.group(1), m.group(2)
        if name == "__url_time_range":
            return "from=now-6h&to=now"
        values = [value] if name == "__value.raw" else variables[name]
        if fmt == "queryparam":
            return "&".join(f"var-{name}={quote(v, safe='')}" for v in values)
        assert fmt is None, fmt
        return quote(values[0] if len(values) == 1 else "{" + ",".join(values) + "}",
                     safe="")

    query = re.sub(r"\$\{([\w.]+)(?::(\w+))?\}", one, url).split("?", 1)[1]
    out: dict[str, list[str]] = {}
    for key, got in parse_qsl(query):
        if key.startswith("var-"):
            out.setdefault(key.removeprefix("var-"), []).append(got)
    return out


def test_a_node_s_link_opens_its_dashboard_with_the_clusters_chosen(two_clusters: str) -> None:
    """With two clusters chosen on the fleet dashboard, a node's link in a table opens the
    node dashboard on those clusters (``${cluster}`` in a data link wrote ``{a,b}``, one
    value no series has: every panel of the node dashboard came up empty)."""
    fleet = dashboards()["gpuscope-fleet"]
    node_board = dashboards()["gpuscope-node"]
    chosen = {"datasource": ["prometheus"], "cluster": ["a", "b"]}
    now = time.time()
    links = [link for p in panels(fleet) if p["type"] == "table"
             for o in p["fieldConfig"]["overrides"] for prop in o["properties"]
             if prop["id"] == "links" for link in prop["value"]]
    assert links
    for link in links:
        params = follow(link["url"], chosen, "x")
        assert params["cluster"] == ["a", "b"], (link["url"], params)
    node_link = next(link["url"] for link in links if "/d/gpuscope-node/" in link["url"])
    params = follow(node_link, chosen, NODE)
    # The node dashboard's variables as Grafana sets them from the URL: several values of a
    # Prometheus regex matcher are written (a|b).
    values = {"cluster": "(" + "|".join(params["cluster"]) + ")", "node": params["node"][0]}
    devices = next(p for p in panels(node_board) if p["title"] == "Devices")
    result = _run(two_clusters, devices["targets"][0], values, now)
    assert {r["metric"].get("cluster") for r in result} == {"a", "b"}


# ---- VictoriaMetrics as the data source ----------------------------------------------------


def _evaluated_until(prometheus: str) -> float:
    """The latest instant every rule group of ``prometheus`` has evaluated and written (its
    groups' oldest ``lastEvaluation``, which a group reports once its evaluation is done).
    A copy read as of the clock instead could miss samples that a group stamps before that
    instant and writes after the read: under load an evaluation of the rules takes seconds,
    and a recorded series only just begun (the idle nodes' and spinning GPUs' counts, a
    full run at 3 processes) had Prometheus answer at the copy's end where the copy had
    nothing."""
    groups = requests.get(prometheus + "/api/v1/rules", timeout=30).json()["data"]["groups"]
    ends = []
    for group in groups:
        m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?Z", group["lastEvaluation"])
        assert m, group["lastEvaluation"]
        ends.append(datetime.fromisoformat(m[1] + "+00:00").timestamp() + float(m[2] or 0))
    return min(ends)


def _recorded(prometheus: str, now: float) -> Iterator[dict[str, Any]]:
    """The rules' recorded series as the Prometheus of the demo store holds them (every
    second since it began evaluating), in VictoriaMetrics' import form."""
    names = requests.get(prometheus + "/api/v1/label/__name__/values", timeout=30).json()["data"]
    for name in names:
        if ":" not in name:
            continue
        for r in _query(prometheus, f'{{__name__="{name}"}}', start=f"{now - 2000:.3f}",
                        end=f"{now:.3f}", step="1"):
            yield {"metric": r["metric"],
                   "values": [float(v) for _, v in r["values"]],
                   "timestamps": [int(float(t) * 1000) for t, _ in r["values"]]}


@pytest.fixture(scope="module", autouse=True)
def demo_recorded(demo_prometheus: str) -> tuple[float, list[dict[str, Any]]]:
    """The rules' recorded series as the demo store holds them when it is ready, and the
    time they end, taken before this module's other tests (autouse): the comparisons
    below are made as of that time, however late they run. Later, the raw samples' end is
    more than the 5-minute lookback behind the recorded series' end: the rules have stopped
    recording and Prometheus has written its staleness markers, which a copy cannot carry
    (a slow run's VictoriaMetrics answered the stale series at the copy's end)."""
    now = _evaluated_until(demo_prometheus)
    return now, list(_recorded(demo_prometheus, now))


@pytest.fixture(scope="module")
def demo_victoriametrics(demo_samples: OpenMetricsWriter,
                         demo_recorded: tuple[float, list[dict[str, Any]]]
                         ) -> Iterator[tuple[str, float]]:
    """A VictoriaMetrics holding what the demo store holds: the fleet's raw samples, and
    the recorded series of the rules (as a store's ruler, vmalert, would have written
    them). Yields its address and the time the recorded series end."""
    now, recorded = demo_recorded
    # -search.minStalenessInterval=5m, VictoriaMetrics' flag for Prometheus' lookback: by
    # default it carries a series past its last sample only about as far as its samples'
    # interval, Prometheus 5 minutes. A range panel's 30 minutes that start 0 to 5 minutes
    # after a pod's run ended then hold that pod to Prometheus and not to VictoriaMetrics;
    # which pods, depends on how long after the demo's samples this runs (under load:
    # bert-pretrain-master-0's held usage, mixtral-pretrain's workers' clocks).
    with start_victoriametrics(cache=False, extra_args=[
            "-search.latencyOffset=0s", "-search.minStalenessInterval=5m"]) as vm:
        def raw() -> Iterator[bytes]:
            for lines in demo_samples.families.values():
                for line in lines:
                    head, at = line.rsplit(" ", 1)
                    yield f"{head} {int(float(at) * 1000)}\n".encode()
        vm.import_lines(raw(), fmt="prometheus")
        vm.import_series(recorded)
        vm.refresh()
        yield vm.url, now


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_answers_alike_on_victoriametrics(
        name: str, demo_prometheus: str, demo_victoriametrics: tuple[str, float]) -> None:
    """Every query of every panel, MetricsQL's reading of it against a VictoriaMetrics
    holding the same samples: accepted, and the same series as Prometheus answers."""
    vm, now = demo_victoriametrics
    wrong = []
    targets = answered = 0
    for panel in panels(dashboards()[name]):
        for target in panel.get("targets", []):
            where = f"{panel['title']} / {target['refId']}"
            want = {json.dumps(r["metric"], sort_keys=True)
                    for r in _run(demo_prometheus, target, VALUES[name][0], now)}
            try:
                got = {json.dumps(r["metric"], sort_keys=True)
                       for r in _run(vm, target, VALUES[name][0], now)}
            except AssertionError as exc:
                wrong.append(f"{where}: {str(exc)[:300]}")
                continue
            if target["range"] and not want:
                # The demo's raw samples end when the test session began, and the rules
                # recorded from when the store began: on a slow machine their overlap is
                # gone before this test runs. VictoriaMetrics' rate() reads the sample
                # before its window too, so it answers a while longer: nothing to compare.
                continue
            targets += 1
            answered += bool(got)
            if got != want:
                wrong.append(f"{where}: only Prometheus {sorted(want - got)[:2]}, only "
                             f"VictoriaMetrics {sorted(got - want)[:2]}")
    assert not wrong, "\n".join(wrong)
    assert answered >= 0.8 * targets, (answered, targets)


# ---- what the numbers count ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpuscope-fleet", "gpuscope-pods"])
def test_allocated_idle_containers_are_containers(name: str, demo_prometheus: str) -> None:
    """"Allocated-idle containers" is the number of containers (the gpuscope dashboard's
    "1 allocated-idle container, on 2 devices"), not of the rows of GpuAllocatedButIdle, one
    per container and device: the demo's notebook holds two idle GPUs and counted twice."""
    rows = _query(demo_prometheus, Rules.load().expr("GpuAllocatedButIdle"))
    containers = {tuple(r["metric"].get(k, "") for k in ("node", "namespace", "pod",
                                                         "container")) for r in rows}
    assert len(containers) < len(rows)  # a container holding two devices: the case
    stat = next(p for p in panels(dashboards()[name])
                if p["type"] == "stat" and p["title"] == "Allocated-idle containers")
    [got] = _run(demo_prometheus, stat["targets"][0], VALUES[name][0], time.time())
    assert float(got["value"][1]) == len(containers)


THROTTLED_NODE = "ip-10-0-9-99.ec2.internal"


class _ThrottledNode(OpenMetricsWriter):
    """The demo fleet and one more node whose eight GPUs are held down by their power limit
    all the time (``gpu_throttle_seconds_total{reason="power"}`` growing 1 s a second), of
    no known capacity type."""

    def __init__(self, of: OpenMetricsWriter) -> None:
        super().__init__()
        self.end = of.end
        self.families = {name: list(lines) for name, lines in of.families.items()}
        stamps = sorted({float(line.rsplit(" ", 1)[1]) for line in of.families["gpu_node_info"]})
        where = f'instance="{THROTTLED_NODE}:9463",job="gpuscope",node="{THROTTLED_NODE}"'
        # A node whose labels name no capacity type (not a spot or on-demand node pool).
        for at in stamps:
            self.families["gpu_node_info"].append(
                f'gpu_node_info{{capacity_type="",{where},instance_type="p5.48xlarge",'
                f'node_name="",zone=""}} 1.0 {at:.3f}\n')
        for gpu in range(8):
            uuid = f"GPU-00000000-0000-0000-0000-00000000009{gpu}"
            for at in stamps:
                self.families["gpu_info"].append(
                    f'gpu_info{{gpu="{gpu}",{where},mig_profile="",model="NVIDIA H100 80GB HBM3",'
                    f'parent_uuid="",uuid="{uuid}"}} 1.0 {at:.3f}\n')
                self.families["gpu_throttle_seconds_total"].append(
                    f'gpu_throttle_seconds_total{{gpu="{gpu}",{where},reason="power",'
                    f'uuid="{uuid}"}} {at - stamps[0]!r} {at:.3f}\n')


@pytest.fixture(scope="module")
def throttled_store(prometheus_bin: str, promtool: str, demo_samples: OpenMetricsWriter,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(prometheus_bin, promtool, _ThrottledNode(demo_samples),
                      tmp_path_factory.mktemp("grafana-throttled"), (), timeout=240)


@pytest.mark.timeout(480)
def test_a_node_s_throttled_time_is_a_share_of_its_gpu_time(throttled_store: str) -> None:
    """The node dashboard's "Throttled time by reason" is in percent: a node whose every
    GPU is power-throttled all the time reads 100 % power, not 800 % (the sum over its
    eight GPUs)."""
    board = dashboards()["gpuscope-node"]
    panel = next(p for p in panels(board) if p["title"] == "Throttled time by reason")
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    [power] = [r for r in _run(throttled_store, panel["targets"][0],
                               {"cluster": ".*", "node": THROTTLED_NODE}, time.time())
               if r["metric"]["reason"] == "power"]
    values = [float(v) for _, v in power["values"]]
    assert statistics.median(values) == pytest.approx(1.0, rel=0.05)


def test_the_stacked_idle_dollars_count_a_gpu_once(demo_prometheus: str) -> None:
    """The fleet's "Idle $/hour" stacks idle nodes and spinning GPUs: a total, in which a
    spinning GPU of an idle node is already in its node's price (the gpuscope dashboard's
    spinning waste is a part of the idle waste). The hung p5 node, idle with eight spinning
    GPUs, was counted twice: 55.04 $/hour more than the fleet burns."""
    fleet = dashboards()["gpuscope-fleet"]
    panel = next(p for p in panels(fleet) if p["title"] == "Idle $/hour")
    rules = Rules.load()
    idle_nodes = {r["metric"]["node"] for r in _query(
        demo_prometheus, rules.expr("GpuNodeUnderutilized"))}
    spinning = _query(demo_prometheus, "uuid:gpu_spinning_utilization:ratio")
    assert {r["metric"]["node"] for r in spinning} & idle_nodes  # the case: HUNG_NODE
    node_price = {r["metric"]["node"]: float(r["value"][1])
                  for r in _query(demo_prometheus, NODE_PRICE)}
    device_price = {r["metric"]["node"]: float(r["value"][1])
                    for r in _query(demo_prometheus, DEVICE_PRICE)}
    expected = sum(node_price[n] for n in idle_nodes if n in node_price) + sum(
        device_price[r["metric"]["node"]] for r in spinning
        if r["metric"]["node"] not in idle_nodes and r["metric"]["node"] in device_price)
    total = 0.0
    for target in panel["targets"]:
        # The panel's range queries at one instant: its last point.
        at_now = {**target, "instant": True}
        total += sum(float(r["value"][1]) for r in _run(demo_prometheus, at_now,
                                                        VALUES["gpuscope-fleet"][0],
                                                        time.time()))
    assert total == pytest.approx(expected)


@pytest.mark.timeout(480)
def test_a_node_of_no_capacity_type_is_named_without_the_label_s_name(
        throttled_store: str) -> None:
    """The node dashboard's instance type of a node whose labels give no capacity type
    (``capacity_type=""``, a node pool that is neither spot nor on demand by its labels)
    read "p5.48xlarge (capacity_type)"."""
    board = dashboards()["gpuscope-node"]
    panel = next(p for p in panels(board) if p["title"] == "Instance type")
    target = panel["targets"][0]
    [row] = _run(throttled_store, target, {"cluster": ".*", "node": THROTTLED_NODE},
                 time.time())
    assert legend(target["legendFormat"], row["metric"]) == "p5.48xlarge (capacity type unknown)"
