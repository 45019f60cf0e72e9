"""Issue 30, the rules' part: many clusters in one store, and HA pairs counted once.

- Every ``by``/``on`` of the ``gpuscope.rules`` and ``gpuscope.alerts`` groups names the
  cluster label, and every ``without`` list is the replica labels (a static check; the
  behaviour is checked below, with real tools).
- ``promtool test rules``: ``tests/alerts/promtool/multi_cluster_test.yaml`` (one node name in
  two clusters; ``test_rules.py`` runs it with the others) and, here, every promtool file
  again with each input series written twice, under ``<replica label>="0"`` and ``"1"``: the
  same recorded values and the same alerts, once each. With the replica labels rendered away
  (``--replica-labels ''``) the doubled data fails them (the test can fail).
- The generator: ``--cluster-label k8s_cluster`` renders rules that group by ``k8s_cluster``
  (promtool accepts them, and the two-cluster test passes with its label renamed, but not
  against the default rules); ``--replica-labels`` likewise; bad values are one
  ``gpuscope-render: error:`` line and exit 2.
- The same rules evaluated by a real vmalert against a central VictoriaMetrics holding both
  clusters' series (the two-cluster test's first case), once as one copy and once written
  twice under ``prometheus_replica``: the alerts fire for cluster "a" only, once each, with
  its name in their annotations, and the recorded node-level counts are the single copy's.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscope.alerts.render import (
    DEFAULT_REPLICA_LABELS,
    RULES_FILE,
    cap_for,
    cap_ranges,
    dump_yaml,
    load_rules,
    relabel_rules,
)
from tests.alerts.conftest import REPO, Webhook
from tests.alerts.promtool_groups import write_specs
from tests.stores import Store, binary, free_port, start_victoriametrics

PROMTOOL_DIR = Path(__file__).parent / "promtool"
TWO_CLUSTERS = PROMTOOL_DIR / "multi_cluster_test.yaml"
#: The files of the alerting groups (the gpuscope-dashboard group's own file is the
#: dashboard's: tests/dashboard/test_recording_rules.py).
ALERTING_TESTS = sorted(p for p in PROMTOOL_DIR.glob("*_test.yaml")
                        if p.name != "gpuscope_dashboard_test.yaml")
GROUPS = ("gpuscope.rules", "gpuscope.alerts")
NODE = "ip-10-0-1-23.ec2.internal"


def groups_of(rules: dict[str, Any], names: tuple[str, ...] = GROUPS) -> list[dict[str, Any]]:
    return [g for g in rules["groups"] if g["name"] in names]


def lists(expr: str, keyword: str) -> list[list[str]]:
    """The label lists of every ``keyword (...)`` in ``expr`` (``by``, ``on``, ``without``)."""
    return [[x.strip() for x in m.group(1).split(",") if x.strip()]
            for m in re.finditer(rf"\b{keyword}\s*\(([^()]*)\)", expr)]


# -- static: every grouping names the cluster, every without() is the replica labels ------


@pytest.mark.parametrize("rule", [r for g in groups_of(load_rules()) for r in g["rules"]],
                         ids=lambda r: r.get("record") or r["alert"])
def test_every_by_and_on_names_the_cluster_and_every_without_the_replicas(
        rule: dict[str, Any]) -> None:
    expr = rule["expr"]
    for keyword in ("by", "on"):
        for labels in lists(expr, keyword):
            # `on ()`: a presence check against the whole store (GpuExporterDown).
            assert labels == [] or "cluster" in labels, (keyword, labels, expr)
    for labels in lists(expr, "without"):
        # An alert about a device or a container also leaves out the exporter pod's address
        # (``instance``, ``job``): a rollout gives it a new one, and keyed by it the alert
        # would end and its ``for`` begin again.
        own = labels[:2] == ["instance", "job"] and "alert" in rule
        assert labels[2 if own else 0:] in ([], list(DEFAULT_REPLICA_LABELS)), (labels, expr)
        assert own or labels, expr
    if "alert" in rule:
        for key in ("summary", "description"):
            assert "{{ with $labels.cluster }}" in rule["annotations"][key], key


# -- promtool: replicas, renamed labels ----------------------------------------------------


def with_label(series: str, label: str, value: str) -> str:
    """A promtool series (``name{a="b"}``) with one more label."""
    if series.rstrip().endswith("}"):
        head = series.rstrip()[:-1].rstrip()
        sep = "" if head.endswith("{") else ", "
        return f'{head}{sep}{label}="{value}"}}'
    return f'{series.strip()}{{{label}="{value}"}}'


def doubled(spec: dict[str, Any], label: str) -> dict[str, Any]:
    """A promtool test file's content with every input series written twice, under
    ``label="0"`` and ``label="1"`` (two HA replicas' copies of the same samples)."""
    out = copy.deepcopy(spec)
    for case in out["tests"]:
        case["input_series"] = [
            {**s, "series": with_label(s["series"], label, replica)}
            for s in case["input_series"] for replica in ("0", "1")
        ]
    return out


def run_promtool(promtool: str, rules: Path, specs: dict[str, dict[str, Any]], work: Path
                 ) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on ``specs`` (file name -> content), each reading the groups
    of ``rules`` it names (:func:`~tests.alerts.promtool_groups.write_specs`)."""
    paths = write_specs(specs, rules, work)
    return subprocess.run([promtool, "test", "rules", *paths], capture_output=True, text=True,
                          timeout=300, cwd=work)


def spec_of(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def render(tmp: Path, *flags: str) -> Path:
    """``python -m gpuscope.alerts.render --format rules FLAGS`` into a file."""
    out = tmp / "rendered-rules.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.render", "--format", "rules", "-o", str(out),
         *flags], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return out


def test_the_promtool_files_are_the_ones_doubled_here() -> None:
    assert TWO_CLUSTERS in ALERTING_TESTS
    assert len(ALERTING_TESTS) >= 14  # one per alert, and the two clusters


@pytest.mark.timeout(360)  # (every promtool file in one run, as test_rules.py's)
def test_two_replicas_of_every_promtool_case_give_the_same_results(
        promtool: str, tmp_path: Path) -> None:
    """Every alerting test file, its data written twice under a replica label: the expected
    recorded samples (node counts, sharing counts, shares) and alerts are unchanged, each
    alert once. The three default replica labels take turns by file (each file once: the
    static test above holds every ``without`` to all three), so that each label is doubled
    in some files, the two-cluster file's included."""
    labels = {p.name: DEFAULT_REPLICA_LABELS[i % len(DEFAULT_REPLICA_LABELS)]
              for i, p in enumerate(ALERTING_TESTS)}
    assert set(labels.values()) == set(DEFAULT_REPLICA_LABELS)
    specs = {p.name: doubled(spec_of(p), labels[p.name]) for p in ALERTING_TESTS}
    result = run_promtool(promtool, RULES_FILE, specs, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert result.stdout.count("SUCCESS") == len(specs), result.stdout


def test_without_the_replica_labels_doubled_data_counts_twice(
        promtool: str, tmp_path: Path) -> None:
    """The control: the same rules rendered with no replica labels (``without ()``) count
    the doubled two-cluster data twice, which the test above would catch."""
    rules = render(tmp_path, "--replica-labels", "")
    assert "without ()" in rules.read_text()
    result = run_promtool(promtool, rules, {TWO_CLUSTERS.name: doubled(
        spec_of(TWO_CLUSTERS), "prometheus_replica")}, tmp_path)
    assert result.returncode != 0
    report = result.stdout + result.stderr
    # An alert sent once per replica. (The node's GPUs are counted by uuid and a device's
    # containers by their identity, once with or without the replica labels.)
    got = report[report.index("got:"):]
    assert 'pod="trainer-0", prometheus_replica="1"' in got, report[-3000:]
    assert "uuid:container_gpu_sharing:count" not in report, report[-3000:]


def renamed_cluster(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The two-cluster test with its ``cluster`` label called ``name`` (in the series,
    the expected samples and the expected alerts' labels; annotations unchanged)."""
    text = json.dumps(spec)
    text = re.sub(r'\bcluster(\\?"?)=', rf"{name}\1=", text)  # series and sample labels
    out: dict[str, Any] = json.loads(text)
    for case in out["tests"]:
        for check in case.get("alert_rule_test", []):
            for alert in check.get("exp_alerts") or []:
                labels = alert["exp_labels"]
                if "cluster" in labels:
                    labels[name] = labels.pop("cluster")
    return out


def test_cluster_label_renamed_by_the_generator(promtool: str, tmp_path: Path) -> None:
    rules = render(tmp_path, "--cluster-label", "k8s_cluster")
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    rendered = yaml.safe_load(rules.read_text())
    exprs = [r["expr"] for g in groups_of(rendered) for r in g["rules"]]
    groupings = [labels for e in exprs for k in ("by", "on") for labels in lists(e, k)
                 if labels]
    assert len(groupings) > 100
    assert all("k8s_cluster" in labels and "cluster" not in labels for labels in groupings)
    annotations = [r["annotations"] for g in groups_of(rendered) for r in g["rules"]
                   if "alert" in r]
    texts = " ".join(a["summary"] + a["description"] for a in annotations)
    assert not re.search(r"\$labels\.cluster\b|(?<!\w)cluster=%q", texts)
    assert texts.count("k8s_cluster=%q") == 2  # the annotations' queries
    assert all("{{ with $labels.k8s_cluster }}" in a[key] for a in annotations
               for key in ("summary", "description"))
    # The two clusters, their label renamed: right with the renamed rules ...
    spec = renamed_cluster(spec_of(TWO_CLUSTERS), "k8s_cluster")
    assert "k8s_cluster" in json.dumps(spec) and '"cluster"' not in json.dumps(spec)
    result = run_promtool(promtool, rules, {"renamed_test.yaml": spec}, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # ... and wrong with the default ones, which merge the two nodes of the same name.
    result = run_promtool(promtool, RULES_FILE, {"renamed_test.yaml": spec}, tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode != 0 and "FAILED" in report
    # One node where there are two: cluster a's idle node hidden behind b's busy namesake.
    assert ('node:gpu_idle_devices:count", node="ip-10-0-1-23.ec2.internal"} 0E+00'
            ) in report[report.index("got:"):], report[-3000:]


def test_replica_labels_renamed_by_the_generator(promtool: str, tmp_path: Path) -> None:
    rules = render(tmp_path, "--replica-labels", "dc_replica, ha_pair")
    text = rules.read_text()
    assert "without (dc_replica, ha_pair)" in text
    assert "without (instance, job, dc_replica, ha_pair)" in text  # (the device alerts)
    assert not re.search(r"\b(prometheus_replica|__replica__|replica)\b", text)
    specs = {"dc_test.yaml": doubled(spec_of(TWO_CLUSTERS), "dc_replica")}
    result = run_promtool(promtool, rules, specs, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_default_labels_render_the_rule_file_unchanged() -> None:
    rules = load_rules()
    assert relabel_rules(rules) == rules
    assert relabel_rules(rules, "cluster", list(DEFAULT_REPLICA_LABELS)) == rules


@pytest.mark.parametrize(("flags", "message"), [
    (["--cluster-label", "1cluster"], "not a label name: '1cluster'"),
    (["--cluster-label", "k8s-cluster"], "not a label name: 'k8s-cluster'"),
    (["--cluster-label", "__cluster__"], "reserved"),
    (["--cluster-label", "node"], "--cluster-label: 'node' is already a label"),
    (["--cluster-label", "replica"], "'replica' cannot be both the cluster label and a replica"),
    (["--replica-labels", "a,a"], "--replica-labels: a label appears twice"),
    (["--replica-labels", "replica,pod"], "--replica-labels: 'pod' is already a label"),
    (["--replica-labels", "replica,b c"], "not a label name: 'b c'"),
    (["--cluster-label", "c", "--replica-labels", "c"], "'c' cannot be both"),
    (["--format", "json"], "argument --format: invalid choice"),
])
def test_bad_label_flags_are_one_line_and_exit_2(flags: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "gpuscope.alerts.render", "-o", "-", *flags],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("gpuscope-render: error: ")
    assert message in result.stderr


# -- vmalert on a central VictoriaMetrics ----------------------------------------------------

FOR_CAP = "2s"
RANGE_CAP = "10s"
STEP_S = 2


def two_cluster_series() -> list[tuple[dict[str, str], float]]:
    """The first case of the two-cluster promtool test: each series' labels (with
    ``__name__``) and its value (the cases hold each series constant: ``VxN``)."""
    case = spec_of(TWO_CLUSTERS)["tests"][0]
    out = []
    for s in case["input_series"]:
        m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}", s["series"])
        assert m, s["series"]
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"', m.group(2)))
        v = re.fullmatch(r"([0-9.]+)x[0-9]+", str(s["values"]))
        assert v, s["values"]
        out.append(({"__name__": m.group(1), **labels}, float(v.group(1))))
    return out


def import_series(vm: Store, series: list[tuple[dict[str, str], float]], start: float,
                  end: float) -> None:
    stamps = [int(t * 1000) for t in range(int(start), int(end), STEP_S)]
    lines = (json.dumps({"metric": labels, "values": [value] * len(stamps),
                         "timestamps": stamps}).encode() + b"\n"
             for labels, value in series)
    vm.import_lines(lines)
    vm.flush()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def sink() -> Iterator[Webhook]:
    """An Alertmanager stand-in: records the alerts vmalert sends (``/api/v2/alerts``)."""
    s = Webhook()
    try:
        yield s
    finally:
        s.close()


def vmalert_alerts(vmalert_url: str) -> list[dict[str, Any]]:
    """vmalert's active alerts (its ``/api/v1/alerts``; null while there is none)."""
    alerts: list[dict[str, Any]] = get_json(vmalert_url + "/api/v1/alerts")["data"]["alerts"]
    return alerts or []


EXPECTED = {
    ("GpuNodeUnderutilized", "a", NODE),
    ("GpuSpinning", "a", NODE),
    ("GpuAllocatedButIdle", "a", NODE),
    ("GpuExporterDown", "c", ""),
}


@pytest.mark.parametrize("replicas", [(), ("0", "1")], ids=["one-copy", "two-replicas"])
def test_vmalert_on_a_central_victoriametrics(
        tmp_path: Path, sink: Webhook, replicas: tuple[str, ...]) -> None:
    series = two_cluster_series()
    if replicas:
        series = [({**labels, "prometheus_replica": r}, v) for labels, v in series
                  for r in replicas]
    rules = tmp_path / "rules.yaml"
    selected = {"groups": groups_of(load_rules(), (*GROUPS, "gpuscope-grafana"))}
    rules.write_text(dump_yaml(cap_ranges(cap_for(selected, FOR_CAP), RANGE_CAP)))
    now = time.time()
    # Queries near now are answered at once (-search.latencyOffset=0s), without the response
    # cache: vmalert reads back what it recorded a second earlier, level after level.
    with start_victoriametrics(cache=False, extra_args=["-search.latencyOffset=0s"]) as vm:
        import_series(vm, series, now - 600, now + 600)
        vm.wait_for_series(len(series), at=now)
        port = free_port()
        vmalert_url = f"http://127.0.0.1:{port}"
        log = tmp_path / "vmalert.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [binary("vmalert"), f"-rule={rules}", f"-datasource.url={vm.url}",
                 f"-remoteWrite.url={vm.url}", "-remoteWrite.flushInterval=500ms",
                 f"-notifier.url={sink.url}", "-evaluationInterval=1s",
                 f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            seen: set[tuple[str, str, str]] = set()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()[-3000:]
                vm.flush()  # what vmalert recorded, searchable now (each level reads the last)
                try:
                    seen = firing_of(vmalert_alerts(vmalert_url))
                except OSError:
                    seen = set()
                if seen >= EXPECTED:
                    break
                time.sleep(0.5)
            # A few more evaluations: nothing else fires (not cluster b, no second copy).
            time.sleep(4)
            waited = time.monotonic() - deadline + 120
            alerts = vmalert_alerts(vmalert_url)
            counts = {name: vm.query(name) for name in (
                "node:gpu_idle_devices:count", "node:gpu_measured_devices:count",
                "node:gpu_devices:count", "uuid:container_gpu_sharing:count",
                "node:gpu_device_price_dollars_per_hour:on_demand")}
            replica_copies = vm.query(
                'count({__name__=~"(uuid|node|container):.+", prometheus_replica!=""})')
        finally:
            proc.terminate()
            proc.wait(30)
        # An evaluation in flight when vmalert is stopped logs "context canceled": not an
        # error of the rules (seen once in a full run).
        errors = [line for line in log.read_text().splitlines()
                  if "error" in line.lower() and "context canceled" not in line]
        assert not errors, errors[-20:]
    print(f"expected alerts firing after {waited:.1f}s")
    assert firing_of(alerts) == EXPECTED, alerts
    # One alert per (alert, cluster, node, device/container): no replica copies.
    keys = [(a["name"], tuple(sorted(a["labels"].items()))) for a in alerts
            if a["state"] == "firing"]
    assert len(keys) == len(set(keys)) == len(EXPECTED)
    assert not any("prometheus_replica" in a["labels"] for a in alerts)
    by_name = {a["name"]: a for a in alerts if a["state"] == "firing"}
    idle = by_name["GpuNodeUnderutilized"]
    assert idle["annotations"]["summary"] == (
        f"GPU node {NODE} of cluster a has been idle for 1h")
    # The annotation's query finds cluster a's node, not b's namesake (p4d.24xlarge).
    assert idle["annotations"]["description"].startswith(
        f"Every GPU on node {NODE} (g5.12xlarge) of cluster a has been idle"), idle
    assert by_name["GpuExporterDown"]["annotations"]["summary"] == (
        "gpuscope exporter down in cluster c")
    # What an Alertmanager would get: the same alerts, with their cluster.
    sent = {(a["labels"]["alertname"], a["labels"].get("cluster", ""))
            for _, body in sink.drain() for a in body}
    assert sent == {(name, cluster) for name, cluster, _ in EXPECTED}
    # The recorded node-level series: one per (cluster, node), the single copy's values.
    assert values(counts["node:gpu_idle_devices:count"]) == {("a", NODE): 2, ("b", NODE): 0}
    for name in ("node:gpu_measured_devices:count", "node:gpu_devices:count"):
        assert values(counts[name]) == {("a", NODE): 2, ("b", NODE): 2}, name
    assert [float(s["value"][1]) for s in counts["uuid:container_gpu_sharing:count"]] == [1, 1]
    assert values(counts["node:gpu_device_price_dollars_per_hour:on_demand"]) == {
        ("a", NODE): pytest.approx(5.672 / 2), ("b", NODE): pytest.approx(21.957642 / 2)}
    assert replica_copies == []


def firing_of(alerts: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(a["name"], a["labels"].get("cluster", ""), a["labels"].get("node", ""))
            for a in alerts if a["state"] == "firing"}


def values(result: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for s in result:
        key = (s["metric"].get("cluster", ""), s["metric"]["node"])
        assert key not in out, result
        out[key] = float(s["value"][1])
    return out
