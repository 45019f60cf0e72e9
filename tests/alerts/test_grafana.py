"""The Grafana dashboards (``python -m gpuscope.alerts.grafana``): current, valid against
Grafana's published JSON schemas, built from the rule file, and every query of every panel
answered with data by a real Prometheus holding the demo fleet's past hour.

The demo fleet (``dashboard/demo/*.yaml``, the one ``gpuscope-dashboard --demo`` runs) is
backfilled into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics`` (the
exporters' own collectors render each past sample, :meth:`DemoFleet.backfill`), and
Prometheus evaluates the shipped rule file, unchanged, over it.
"""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
import subprocess
import time
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import yaml

from gpuscope.alerts.grafana import __main__ as cli
from gpuscope.alerts.grafana.dashboards import DASHBOARDS
from gpuscope.alerts.grafana.promql import (
    ScopeError,
    count_once,
    labels_named,
    rename_label,
    scope,
)
from gpuscope.alerts.grafana.rules import (
    DEVICE_PRICE,
    INSTANCE_PRICE,
    NODE_PRICE,
    Rules,
    node_info,
    price_group,
)
from gpuscope.alerts.render import RULES_FILE, load_rules
from gpuscope.dashboard.demo import DemoFleet
from gpuscope.dashboard.prices import bundled_prices
from tests.alerts.conftest import REPO, run_with_a_disk_that_fills
from tests.conftest import free_port, wait_for

SCHEMAS = Path(__file__).parent / "schemas"
GENERATED = REPO / "alerts" / "generated" / "grafana"
COMPONENT = REPO / "deploy" / "components" / "grafana-dashboards"
SCHEMA_OF_PANEL = {"timeseries": "timeseries", "stat": "stat", "table": "table",
                   "heatmap": "heatmap", "bargauge": "bargauge",
                   "state-timeline": "statetimeline"}
LEGACY = {"graph", "singlestat", "table-old", "grafana-piechart-panel"}

# What the demo fleet holds, for the variables (each is checked to be among the values the
# variable's own query lists).
NODE = "ip-10-0-6-20.ec2.internal"  # p5.48xlarge: MIG slices (GPM), pods, near misses
HUNG_NODE = "ip-10-0-1-12.ec2.internal"  # p5.48xlarge spinning in a hung collective
WORKLOAD = "PyTorchJob/mixtral-pretrain"  # 16 ranks on two nodes, one throttled slow rank
HISTORY = 3600.0
STEP = 15.0


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(GENERATED.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


# ---- the files are current, and made from the rule file ---------------------------------


def test_committed_files_are_what_the_generator_writes() -> None:
    files = cli.outputs()
    assert {p.name for p in files if p.suffix == ".json"} == {f"{n}.json" for n in DASHBOARDS}
    for path, text in files.items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} is out of date: run python -m gpuscope.alerts.grafana")
    assert cli.main(["--check"]) == 0


def test_a_rule_change_changes_the_dashboards_and_check_fails(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    text = RULES_FILE.read_text(encoding="utf-8")
    assert text.count("(uuid:gpu_activity:ratio < bool 0.05)") == 1
    changed = tmp_path / "rules.yaml"
    changed.write_text(text.replace("(uuid:gpu_activity:ratio < bool 0.05)",
                                    "(uuid:gpu_activity:ratio < bool 0.1)"))
    assert cli.main(["--rules", str(changed), "--check"]) == 0  # a recorded rule: same panels
    alert = "container:gpu_held_usage:ratio[2m]) < 0.05"
    assert text.count(alert) == 1
    changed.write_text(text.replace(alert, "container:gpu_held_usage:ratio[2m]) < 0.02"))
    assert cli.main(["--rules", str(changed), "--check"]) == 1
    err = capsys.readouterr().err
    assert "gpuscope-fleet.json is out of date" in err
    assert "gpuscope-pods.json is out of date" in err
    assert "gpuscope-node.json" not in err  # it does not show GpuAllocatedButIdle
    fleet = DASHBOARDS["gpuscope-fleet"](Rules(yaml.safe_load(changed.read_text())))
    exprs = [t["expr"] for p in panels(fleet) for t in p.get("targets", [])]
    assert any("container:gpu_held_usage:ratio{" in e and "< 0.02" in e for e in exprs)


def test_a_price_change_changes_the_price_rules(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("p5.48xlarge: 40.0\nmy-gpu-box.large: 3.5\n")
    rules = tmp_path / "rules.yaml"
    # A group added after the generated one (by hand) is kept as it is.
    after = "  - name: added-later\n    rules:\n      - record: a:b:c\n        expr: vector(1)\n"
    rules.write_text(RULES_FILE.read_text(encoding="utf-8") + after)
    assert cli.main(["--rules", str(rules), "--prices", str(prices), "--check"]) == 1
    assert f"{rules} is out of date" in capsys.readouterr().err
    # Written to a copy of the rule file, dashboards to a scratch folder: the group only.
    files = cli.outputs(rules, prices, out_dirs=(tmp_path,))
    assert files[rules].endswith("(generated)\n" + after)
    group = yaml.safe_load(files[rules])["groups"][-2]
    assert group["name"] == "gpuscope-grafana"
    by_type = {r["labels"]["instance_type"]: r["expr"] for r in group["rules"]
               if r["record"] == INSTANCE_PRICE}
    assert by_type["p5.48xlarge"] == "vector(40.0)"
    assert by_type["my-gpu-box.large"] == "vector(3.5)"
    assert by_type["g5.12xlarge"] == "vector(5.672)"  # the bundled table still beneath
    before = RULES_FILE.read_text(encoding="utf-8")
    head = before[:before.index("  # ---- gpuscope-grafana")]
    assert files[rules].startswith(head)  # nothing above the generated group changes


def test_the_price_group_is_the_price_table() -> None:
    table = bundled_prices()
    group = next(g for g in load_rules()["groups"] if g["name"] == "gpuscope-grafana")
    assert group == price_group(table)
    assert load_rules()["groups"][-1] is not None and load_rules()["groups"][-1]["name"] == (
        "gpuscope-grafana")
    priced = {r["labels"]["instance_type"]: float(r["expr"][len("vector("):-1])
              for r in group["rules"] if r["record"] == INSTANCE_PRICE}
    assert priced == {p.instance_type: p.per_hour for p in table.entries()}


def test_the_instance_type_count_keys_gpu_node_info_as_the_price_rules() -> None:
    """``node_instance_type:gpu_devices:count`` (hand-written in ``gpuscope.rules``) joins
    ``gpu_node_info`` as the generated price rule does (``node_info()``): a fix to one that
    missed the other would key a node's GPUs and its price apart
    (``tests/alerts/promtool/multi_cluster_test.yaml`` tests what they answer)."""
    def flat(text: str) -> str:
        return " ".join(text.split())
    rules = Rules.load()
    assert flat(node_info("instance_type")) in flat(
        rules.expr("node_instance_type:gpu_devices:count"))
    assert flat(node_info("instance_type, capacity_type")) in flat(rules.expr(NODE_PRICE))


@pytest.mark.parametrize(("change", "message"), [
    ("no-rule", "no rule named 'GpuSpinning' in the rule file"),
    ("no-marker", "the rule file has no line starting"),
    ("bad-prices", "expected a number of dollars per hour"),
])
def test_bad_input_is_one_line_and_exit_2(change: str, message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = RULES_FILE.read_text(encoding="utf-8")
    args = ["--check"]
    if change == "no-rule":
        text = text.replace("- alert: GpuSpinning", "- alert: GpuSpinningRenamed")
    elif change == "no-marker":
        text = text[:text.index("  # ---- gpuscope-grafana")]
    else:
        prices = tmp_path / "prices.yaml"
        prices.write_text("p5.48xlarge: free\n")
        args += ["--prices", str(prices)]
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    assert cli.main(["--rules", str(rules), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuscope-grafana: error: "), err
    assert message in err


@pytest.mark.parametrize(("content", "message"), [
    (b"\xfc\x00\x81binary", "not UTF-8 text"),
    (b"groups: []\n" + b"#" * (17 << 20), "larger than 16 MiB"),
])
def test_unreadable_rule_file_is_one_line_and_exit_2(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule file that is not UTF-8 text, or far too large to be one, is one error line
    (it was a UnicodeDecodeError traceback, or the whole file in memory)."""
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(content)
    assert cli.main(["--rules", str(rules), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuscope-grafana: error: "), err
    assert message in err


def test_a_failed_write_leaves_the_rule_file_whole(tmp_path: Path) -> None:
    """The rule file is rewritten in place (its price group): a write that fails part-way
    (here a file-size limit, as a full disk) is one error line, and the file is still the
    old one, not cut short; no temporary file is left beside it."""
    rules = tmp_path / "rules.yaml"
    before = RULES_FILE.read_text(encoding="utf-8")
    rules.write_text(before, encoding="utf-8")
    prices = tmp_path / "prices.yaml"
    prices.write_text("p5.48xlarge: 40.0\n")  # the price group changes: the file is written
    result = run_with_a_disk_that_fills(
        ["-m", "gpuscope.alerts.grafana", "--rules", str(rules), "--prices", str(prices)],
        limit=16 << 10)
    assert result.returncode == 2, result.stderr[-300:]
    assert len(result.stderr.splitlines()) == 1, result.stderr[-300:]
    assert result.stderr.startswith(f"gpuscope-grafana: error: {rules}: cannot write: ")
    assert rules.read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prices.yaml", "rules.yaml"]


# ---- a store whose cluster label is called otherwise -------------------------------------


def reads_cluster(expr: str) -> bool:
    """Whether ``expr`` reads or makes a label ``cluster``: the word outside strings (a
    matcher, a ``by``/``on`` list, ``label_values``' label; not the variable ``$cluster``),
    or a string that is exactly ``"cluster"`` (a label given to ``label_join``)."""
    outside = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    return bool(re.search(r"(?<![$\w])cluster\b", outside)) or '"cluster"' in expr


def test_another_cluster_label_is_the_one_every_query_reads(tmp_path: Path) -> None:
    """``--cluster-label k8s_cluster --output-dir DIR`` writes the four dashboards to DIR
    (the committed ones untouched), and none of their queries or variables reads a
    ``cluster`` label: each selector matches ``k8s_cluster=~"$cluster"`` (the variable keeps
    its name, and so do the links that pass it); ``--check`` with the same flags passes.
    (What they answer: ``test_grafana_panels.py``.)"""
    committed = {p: p.read_text(encoding="utf-8") for p in sorted(GENERATED.glob("*.json"))}
    out = tmp_path / "dashboards"
    flags = ["--cluster-label", "k8s_cluster", "--output-dir", str(out)]
    assert cli.main(flags) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.json" for n in DASHBOARDS)
    assert {p: p.read_text(encoding="utf-8") for p in committed} == committed
    assert cli.main([*flags, "--check"]) == 0
    for path in sorted(out.iterdir()):
        board = json.loads(path.read_text(encoding="utf-8"))
        exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
        assert exprs
        for expr in exprs:
            assert not reads_cluster(expr), (path.name, expr)
            assert '{k8s_cluster=~"$cluster"' in expr, (path.name, expr)
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["cluster"]["definition"] == "label_values(gpu_info, k8s_cluster)"
        for variable in variables.values():
            for key in ("query", "definition") if variable["type"] == "query" else ():
                assert not reads_cluster(variable[key]), (path.name, variable[key])
        text = path.read_text(encoding="utf-8")
        assert text.count("${cluster:queryparam}") == committed[GENERATED / path.name].count(
            "${cluster:queryparam}")


@pytest.mark.parametrize(("label", "message"), [
    ("k8s-cluster", "not a label name: 'k8s-cluster'"),
    ("__cluster__", "--cluster-label: '__cluster__' is reserved"),
    ("node", "--cluster-label: 'node' is already a label, metric or keyword of the rules"),
    ("replica", "'replica' cannot be both the cluster label and a replica label"),
    # Labels only the dashboards' queries make (label_join's, for legends).
    ("cluster_node", "--cluster-label: 'cluster_node' is already a label, metric or keyword "
                     "of the dashboards' queries"),
    ("named", "'named' is already a label, metric or keyword of the dashboards' queries"),
])
def test_a_bad_cluster_label_is_one_line_and_exit_2(label: str, message: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The renderer's checks and messages (``python -m gpuscope.alerts.render
    --cluster-label``), and a name the dashboards' own queries use; nothing is written."""
    out = tmp_path / "dashboards"
    assert cli.main(["--cluster-label", label, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuscope-grafana: error: "), err
    assert message in err
    assert not out.exists()


def test_replica_labels_read_each_series_once_in_every_query(tmp_path: Path) -> None:
    """``--replica-labels replica,dc_replica`` (with ``--cluster-label``) writes the four
    dashboards with every query reading each series once over those labels, the variables
    as they were; ``--check`` with the same flags passes and the committed dashboards are
    untouched. (What they answer: ``test_grafana_panels.py``.)"""
    committed = {p: p.read_text(encoding="utf-8") for p in sorted(GENERATED.glob("*.json"))}
    out, plain = tmp_path / "once", tmp_path / "plain"
    flags = ["--cluster-label", "k8s_cluster", "--replica-labels", "replica,dc_replica"]
    assert cli.main([*flags, "--output-dir", str(out)]) == 0
    assert cli.main(["--cluster-label", "k8s_cluster", "--output-dir", str(plain)]) == 0
    assert {p: p.read_text(encoding="utf-8") for p in committed} == committed
    assert cli.main([*flags, "--output-dir", str(out), "--check"]) == 0
    for name in DASHBOARDS:
        board = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        was = json.loads((plain / f"{name}.json").read_text(encoding="utf-8"))
        exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
        assert exprs == [count_once(t["expr"], ("replica", "dc_replica"))
                         for p in panels(was) for t in p.get("targets", [])]
        assert all("max without (replica, dc_replica) (" in e for e in exprs), name
        assert board["templating"] == was["templating"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--replica-labels", "dc-replica"], "not a label name: 'dc-replica'"),
    (["--replica-labels", "replica,replica"], "--replica-labels: a label appears twice"),
    (["--replica-labels", "cluster"], "'cluster' cannot be both the cluster label and a "
                                      "replica label"),
    (["--cluster-label", "k8s_cluster", "--replica-labels", "replica,k8s_cluster"],
     "'k8s_cluster' cannot be both the cluster label and a replica label"),
    (["--replica-labels", "node"], "--replica-labels: 'node' is already a label, metric or "
                                   "keyword of the rules"),
    # A label only the dashboards' queries make (the legends').
    (["--replica-labels", "cluster_node"], "--replica-labels: 'cluster_node' is already a "
                                           "label, metric or keyword of the dashboards' queries"),
])
def test_bad_replica_labels_are_one_line_and_exit_2(flags: list[str], message: str,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The renderer's checks and messages (``python -m gpuscope.alerts.render
    --replica-labels``), and a name the dashboards' own queries use; nothing is written."""
    out = tmp_path / "dashboards"
    assert cli.main([*flags, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuscope-grafana: error: "), err
    assert message in err
    assert not out.exists()


# ---- valid Grafana dashboards ------------------------------------------------------------


def _validator(name: str, definition: str | None = None) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text(encoding="utf-8"))
    if name == "dashboard":
        # Grafana's schema leaves a field override's matcher options and property value
        # open (`options?: _`, `value?: _`); the generated JSON schema turns "anything" into
        # "an object", while Grafana, and the SDK's own builder (`override_by_name` writes
        # `options=name`), write a string there. Only these two are opened up again.
        definitions = copy.deepcopy(schema["definitions"])
        definitions["MatcherConfig"]["properties"]["options"] = {}
        definitions["DynamicConfigValue"]["properties"]["value"] = {}
        schema = {**schema, "definitions": definitions}
    if definition is not None:
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator: jsonschema.Draft7Validator, obj: object, where: str) -> list[str]:
    return [f"{where}{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
            for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_validates_against_grafanas_schemas(name: str) -> None:
    board = dashboards()[name]
    errors = _errors(_validator("dashboard"), board, f"{name}: ")
    query = _validator("prometheus")
    ids = []
    for panel in panels(board):
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        schema = SCHEMA_OF_PANEL[panel["type"]]
        at = f"{name}: panel {panel['title']!r} "
        errors += _errors(_validator(schema, "Options"), panel["options"], at + "options/")
        custom = panel["fieldConfig"]["defaults"].get("custom")
        if custom is not None:
            definitions = json.loads((SCHEMAS / f"{schema}.jsonschema.json").read_text())
            assert "FieldConfig" in definitions["definitions"], (schema, "has no custom config")
            errors += _errors(_validator(schema, "FieldConfig"), custom, at + "custom/")
        for target in panel["targets"]:
            errors += _errors(query, target, at + f"query {target['refId']}/")
    assert errors == []
    assert len(ids) == len(set(ids)), "panel ids must be unique within a dashboard"
    # The schema's own check on an invalid dashboard: it does catch mistakes.
    broken = copy.deepcopy(board)
    broken["panels"][1]["gridPos"]["w"] = "wide"
    broken["templating"]["list"][0]["refresh"] = 7
    assert len(_errors(_validator("dashboard"), broken, "")) == 2


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_current_panel_types_and_the_variables(name: str) -> None:
    board = dashboards()[name]
    kinds = {p["type"] for p in panels(board)}
    assert kinds <= set(SCHEMA_OF_PANEL) | {"row"} and not kinds & LEGACY
    variables = {v["name"]: v for v in board["templating"]["list"]}
    expected = {"gpuscope-fleet": ["datasource", "cluster"],
                "gpuscope-node": ["datasource", "cluster", "node"],
                "gpuscope-workload": ["datasource", "cluster", "namespace", "workload"],
                "gpuscope-pods": ["datasource", "cluster", "namespace", "pod"]}[name]
    assert list(variables) == expected
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            # Tables read instant results as tables; other panels read series, which their
            # legends name (a table-format result would show every value as "Value").
            if panel["type"] == "table":
                assert target["instant"] and target["format"] == "table", panel["title"]
            else:
                assert target["format"] == "time_series", panel["title"]
            # Every selector of every query is narrowed to the chosen cluster (and node).
            assert '{cluster=~"$cluster"' in target["expr"], (panel["title"], target["expr"])
            if name == "gpuscope-node":
                assert 'node=~"$node"' in target["expr"]
    assert board["uid"] == name and len(board["uid"]) <= 40
    # A ConfigMap's data, and kubectl apply's last-applied annotation, hold 256 KiB at most.
    assert len(json.dumps(board)) < 256 * 1024


def test_mig_slices_are_devices_with_their_parent() -> None:
    node = dashboards()["gpuscope-node"]
    devices = next(p for p in panels(node) if p["title"] == "Devices")
    assert "parent_uuid" in devices["targets"][0]["expr"]
    assert "mig_profile" in devices["targets"][0]["expr"]
    gpm = [p for p in panels(node) if p["title"].endswith("(GPM)")]
    assert {p["title"] for p in gpm} == {"SM activity (GPM)", "Tensor activity (GPM)",
                                         "DRAM activity (GPM)"}


# ---- scoping expressions to the variables -------------------------------------------------

MATCH = {"cluster": '=~"$cluster"', "node": '=~"$node"'}

#: (expression, scoped with MATCH and the cluster grouping label)
SCOPED = [
    ("up", 'up{cluster=~"$cluster", node=~"$node"}'),
    ('rate(x{a="b"}[5m] offset 5m)',
     'rate(x{cluster=~"$cluster", node=~"$node", a="b"}[5m] offset 5m)'),
    ("sum by (node) (a) and on (node, uuid) b",
     'sum by (cluster, node) (a{cluster=~"$cluster", node=~"$node"}) and on (cluster, node, '
     'uuid) b{cluster=~"$cluster", node=~"$node"}'),
    ("sum(a) by (node)", 'sum(a{cluster=~"$cluster", node=~"$node"}) by (cluster, node)'),
    ("a * on (node) group_left (gpu) b unless ignoring (x) c",
     'a{cluster=~"$cluster", node=~"$node"} * on (cluster, node) group_left (gpu) '
     'b{cluster=~"$cluster", node=~"$node"} unless ignoring (x) '
     'c{cluster=~"$cluster", node=~"$node"}'),
    ("count without (gpu) (a)", 'count without (gpu) (a{cluster=~"$cluster", node=~"$node"})'),
    ('label_replace(a, "uuid", "$1", "parent_uuid", "(.+)")',
     'label_replace(a{cluster=~"$cluster", node=~"$node"}, "uuid", "$1", "parent_uuid", '
     '"(.+)")'),
    ("max_over_time(a:b:c[6h:1m]) > bool 0.5 or vector(1)",
     'max_over_time(a:b:c{cluster=~"$cluster", node=~"$node"}[6h:1m]) > bool 0.5 or vector(1)'),
    ('{__name__="x"}', '{cluster=~"$cluster", node=~"$node", __name__="x"}'),
    ("a and on (cluster) b", 'a{cluster=~"$cluster", node=~"$node"} and on (cluster) '
                             'b{cluster=~"$cluster", node=~"$node"}'),
    ('a{b="}{"}', 'a{cluster=~"$cluster", node=~"$node", b="}{"}'),
    # Strings of every quoting holding brackets, braces and quotes; a regex's $1.
    ("x{a='}', b=`{`, c=\"\\\"(\"}",
     'x{cluster=~"$cluster", node=~"$node", a=\'}\', b=`{`, c="\\"("}'),
    ('label_replace(x, "dst", "$1", "src", "(.+)[}{)(]")',
     'label_replace(x{cluster=~"$cluster", node=~"$node"}, "dst", "$1", "src", "(.+)[}{)(]")'),
    # `@` modifiers, offsets, a subquery of a nested function.
    ("x @ start() offset 1h", 'x{cluster=~"$cluster", node=~"$node"} @ start() offset 1h'),
    ("rate(x[5m] @ 1700000000)", 'rate(x{cluster=~"$cluster", node=~"$node"}[5m] @ 1700000000)'),
    ('max_over_time(rate(x{a="b"}[5m])[1h:1m] offset -5m)',
     'max_over_time(rate(x{cluster=~"$cluster", node=~"$node", a="b"}[5m])[1h:1m] offset -5m)'),
    ("clamp_max(avg_over_time(x[$__rate_interval]), 1)",
     'clamp_max(avg_over_time(x{cluster=~"$cluster", node=~"$node"}[$__rate_interval]), 1)'),
    # Grafana variables outside a string are neither metric names nor selector braces.
    ("x offset $__interval", 'x{cluster=~"$cluster", node=~"$node"} offset $__interval'),
    ("x offset ${__interval} + rate(y[${__range}])",
     'x{cluster=~"$cluster", node=~"$node"} offset ${__interval} + '
     'rate(y{cluster=~"$cluster", node=~"$node"}[${__range}])'),
    # on () joins within one cluster; ignoring () and without () are left alone.
    ("a * on () b + c / ignoring () d",
     'a{cluster=~"$cluster", node=~"$node"} * on (cluster) b{cluster=~"$cluster", '
     'node=~"$node"} + c{cluster=~"$cluster", node=~"$node"} / ignoring () '
     'd{cluster=~"$cluster", node=~"$node"}'),
    ("a > bool on (x) group_right (y) b",
     'a{cluster=~"$cluster", node=~"$node"} > bool on (cluster, x) group_right (y) '
     'b{cluster=~"$cluster", node=~"$node"}'),
    # Aggregations with a parameter, the grouping before or after.
    ("topk by (a) (5, x)", 'topk by (cluster, a) (5, x{cluster=~"$cluster", node=~"$node"})'),
    ('count_values("v", x) by (a)',
     'count_values("v", x{cluster=~"$cluster", node=~"$node"}) by (cluster, a)'),
    # A comment's brackets are not the expression's.
    ("sum(x) # {( not closed\n+ y",
     'sum(x{cluster=~"$cluster", node=~"$node"}) # {( not closed\n'
     '+ y{cluster=~"$cluster", node=~"$node"}'),
]


@pytest.mark.parametrize(("expr", "scoped"), SCOPED)
def test_scope(expr: str, scoped: str) -> None:
    assert scope(expr, MATCH, ("cluster",)) == scoped


def test_scoped_expressions_are_promql_prometheus_reads(demo_prometheus: str) -> None:
    """Every expected result of :func:`test_scope`, the Grafana variables set, parses in a
    real Prometheus (its ``format_query``), with the matchers on every selector."""
    for _, scoped in SCOPED:
        expr = substitute(scoped, {"cluster": ".*", "node": ".*"})
        r = requests.post(demo_prometheus + "/api/v1/format_query", data={"query": expr},
                          timeout=10)
        body = r.json()
        assert body["status"] == "success", (scoped, body)
        assert body["data"].count('cluster=~".*"') == scoped.count('cluster=~"$cluster"'), (
            scoped, body["data"])


#: (expression, with the label ``cluster`` called ``k8s_cluster``)
RENAMED = [
    ('sum by (cluster, node) (x{cluster=~"$cluster"})',
     'sum by (k8s_cluster, node) (x{k8s_cluster=~"$cluster"})'),
    ("label_values(gpu_info, cluster)", "label_values(gpu_info, k8s_cluster)"),
    ('label_join(x, "cluster_node", "/", "cluster", "node")',
     'label_join(x, "cluster_node", "/", "k8s_cluster", "node")'),
    ("a * on (cluster) group_left () b unless ignoring (cluster) c",
     "a * on (k8s_cluster) group_left () b unless ignoring (k8s_cluster) c"),
    # Grafana variables, other strings and comments are not the label.
    ('x[$__rate_interval] offset ${cluster} + y{a=~"${cluster:regex}|cluster_a"} # cluster',
     'x[$__rate_interval] offset ${cluster} + y{a=~"${cluster:regex}|cluster_a"} # cluster'),
    ("quantile by (cluster) (0.5, x) / $cluster",
     "quantile by (k8s_cluster) (0.5, x) / $cluster"),
]


@pytest.mark.parametrize(("expr", "renamed"), RENAMED)
def test_rename_label(expr: str, renamed: str) -> None:
    assert rename_label(expr, "cluster", "k8s_cluster") == renamed


def test_the_labels_an_expression_names() -> None:
    """Identifiers, and the label names given to label_replace and label_join (not their
    separator, replacement or regex, nor a matcher's value)."""
    expr = ('label_replace(label_join(x{a="b", c=~"d"}, "made", "/", "cluster", "node"), '
            '"cap", "unknown", "capacity_type", "^$") > on (uuid) y')
    assert labels_named(expr) == {"label_replace", "label_join", "x", "a", "c", "made",
                                  "cluster", "node", "cap", "capacity_type", "on", "uuid",
                                  "y"}


@pytest.mark.parametrize("expr", ["sum(a", "a)", "rate(a[5m)", "a{b=\"c\""])
def test_scope_refuses_what_it_cannot_read(expr: str) -> None:
    with pytest.raises(ScopeError):
        scope(expr, MATCH, ("cluster",))


#: (expression, each series read once over the replica labels ``replica`` and ``dc``)
ONCE = [
    ('sum by (node) (x{a="b"})', 'sum by (node) (max without (replica, dc) (x{a="b"}))'),
    # A range selector: the function that reads it, with its modifiers.
    ("sum(rate(x[$__rate_interval] offset 5m)) / on (node) group_left (a) y",
     "sum(max without (replica, dc) (rate(x[$__rate_interval] offset 5m))) / on (node) "
     "group_left (a) max without (replica, dc) (y)"),
    ("quantile_over_time(0.5, x[1h]) > bool 0.5",
     "max without (replica, dc) (quantile_over_time(0.5, x[1h])) > bool 0.5"),
    # An instant selector's modifiers, a subquery, strings and a selector without a name.
    ('x offset -5m or {__name__="y"} @ end()',
     'max without (replica, dc) (x offset -5m) or max without (replica, dc) '
     '({__name__="y"} @ end())'),
    ('max_over_time(x[30m:1m]) + label_replace(y, "a", "$1", "b", "(.*)")',
     'max_over_time((max without (replica, dc) (x))[30m:1m]) + '
     'label_replace(max without (replica, dc) (y), "a", "$1", "b", "(.*)")'),
    ("(sum(x))[5m:1m] * vector(1)", "(sum(max without (replica, dc) (x)))[5m:1m] * vector(1)"),
]


@pytest.mark.parametrize(("expr", "once"), ONCE)
def test_count_once(expr: str, once: str) -> None:
    assert count_once(expr, ("replica", "dc")) == once
    assert count_once(expr, ()) == expr


@pytest.mark.parametrize("expr", ["sum(a", "a)", "x[5m]", "rate(a{b=\"c\"[5m])"])
def test_count_once_refuses_what_it_cannot_read(expr: str) -> None:
    with pytest.raises(ScopeError):
        count_once(expr, ("replica",))


# ---- every query, against a real Prometheus holding the demo fleet -----------------------


class OpenMetricsWriter:
    """A store for :meth:`DemoFleet.backfill`: keeps each node's past samples (with the
    ``node`` label a scrape config adds) by metric name, for ``promtool tsdb
    create-blocks-from openmetrics``."""

    def __init__(self) -> None:
        self.families: dict[str, list[str]] = {}
        self.end = 0.0

    def ingest(self, node: str, samples: Iterable[tuple[str, dict[str, str], float]],
               at: float) -> None:
        self.end = max(self.end, at)
        for name, labels, value in samples:
            if math.isnan(value):
                continue
            lab = {**labels, "node": node, "job": "gpuscope", "instance": f"{node}:9463"}
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(lab.items()))
            self.families.setdefault(name, []).append(f"{name}{{{text}}} {value!r} {at:.3f}\n")

    def write(self, path: Path, replicas: tuple[str, ...] = ()) -> int:
        """The samples, once, or once per HA replica (``prometheus_replica``: two
        Prometheus servers scraping the same exporters into a store that keeps both)."""
        with path.open("w", encoding="utf-8") as f:
            for lines in self.families.values():
                if not replicas:
                    f.writelines(lines)
                for replica in replicas:
                    f.writelines(line.replace("{", f'{{prometheus_replica="{replica}",', 1)
                                 for line in lines)
            f.write("# EOF\n")
        return sum(len(lines) for lines in self.families.values()) * max(1, len(replicas))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _query(base: str, expr: str, **params: str) -> list[dict[str, Any]]:
    path = "/api/v1/query_range" if "start" in params else "/api/v1/query"
    r = requests.post(base + path, data={"query": expr, **params}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def demo_samples() -> OpenMetricsWriter:
    """The demo fleet's past hour, as its exporters would have served it."""
    fleet = DemoFleet(history=HISTORY)
    store = OpenMetricsWriter()
    try:
        fleet.start()
        fleet.backfill(store, step=STEP)  # type: ignore[arg-type]
    finally:
        fleet.stop()
    return store


@pytest.fixture(scope="module")
def demo_prometheus(prometheus_bin: str, promtool: str, demo_samples: OpenMetricsWriter,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus over the demo fleet's past hour, evaluating the shipped rule file."""
    yield from _serve(prometheus_bin, promtool, demo_samples,
                      tmp_path_factory.mktemp("grafana"), ())


@pytest.fixture(scope="module")
def demo_prometheus_ha(prometheus_bin: str, promtool: str, demo_samples: OpenMetricsWriter,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, with every raw series twice, as an HA pair's two Prometheus servers write
    it into a store that does not deduplicate (docs/alerts.md, "HA pairs"), and the rules
    evaluated once, by the store's ruler."""
    yield from _serve(prometheus_bin, promtool, demo_samples,
                      tmp_path_factory.mktemp("grafana-ha"), ("0", "1"))


def _serve(prometheus_bin: str, promtool: str, store: OpenMetricsWriter, tmp: Path,
           replicas: tuple[str, ...], timeout: float = 60.0,
           rules: dict[str, Any] | None = None) -> Generator[str, None, None]:
    """Prometheus over ``store``'s samples, evaluating ``rules`` (the shipped rule file
    where None)."""
    assert store.write(tmp / "fleet.om", replicas) > 100_000
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                    str(tmp / "fleet.om"), str(tmp / "tsdb")],
                   check=True, capture_output=True, timeout=120)
    port = free_port()
    # The rules (the shipped ones unless given), each group evaluated every second (a
    # group's own `interval:` would have the test wait for its first evaluation):
    # expressions unchanged.
    rules = copy.deepcopy(rules) if rules is not None else load_rules()
    for group in rules["groups"]:
        group.pop("interval", None)
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp / "prometheus.yml").write_text(
        "global: {evaluation_interval: 1s}\n"
        f"rule_files: ['{tmp / 'rules.yaml'}']\n"
        "scrape_configs: []\n")
    log = (tmp / "prometheus.log").open("wb")
    prom = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=30d",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        # The last rule of the price chain (its inputs come from another group) has values,
        # and then every group has been evaluated three more times.
        seen: dict[str, set[str]] = {}

        def rules_evaluated() -> bool:
            try:
                if not seen and not _query(base, DEVICE_PRICE):
                    return False
                groups = requests.get(base + "/api/v1/rules", timeout=5).json()["data"]
            except (requests.RequestException, AssertionError, ValueError):
                return False
            for group in groups["groups"]:
                seen.setdefault(group["name"], set()).add(group["lastEvaluation"])
            return len(seen) == len(rules["groups"]) and min(map(len, seen.values())) > 3

        wait_for(rules_evaluated, timeout, "Prometheus to load the blocks and evaluate the rules")
        yield base
    finally:
        prom.terminate()
        prom.wait(15)
        log.close()


#: Grafana's variables, as the test sets them (``$datasource`` is the data source itself).
def substitute(expr: str, values: dict[str, str]) -> str:
    builtins = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
    # ${name} and $name; $1 (a label_replace group) is PromQL's own. An unknown variable
    # is a KeyError: a dashboard must not use one the test does not set.
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: {**builtins, **values}[m.group(1)],
                  expr)


def listed_values(board: dict[str, Any], base: str, values: dict[str, str],
                  ) -> Iterator[tuple[str, set[str], str]]:
    """Each query variable of ``board`` (``label_values(<selector>, <label>)``): its name, the
    values it lists on the store at ``base`` with ``values`` picked for the others, and the
    value picked for it."""
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["definition"])
        assert m, variable["definition"]
        listed = {r["metric"].get(m.group(2), "") for r in _query(
            base, f"group by ({m.group(2)}) ({substitute(m.group(1), values)})")}
        yield variable["name"], listed, values[variable["name"]]


#: Per dashboard, the variable settings the queries run with: a query must answer with
#: data under at least one of them (no one node holds every finding: a count of spinning
#: GPUs is rightly empty on a node with none, and a node with a hung job has no MIG slices).
VALUES: dict[str, list[dict[str, str]]] = {
    "gpuscope-fleet": [{"cluster": ".*"}],
    "gpuscope-node": [{"cluster": ".*", "node": NODE}, {"cluster": ".*", "node": HUNG_NODE}],
    "gpuscope-workload": [{"cluster": ".*", "namespace": ".*", "workload": WORKLOAD}],
    "gpuscope-pods": [{"cluster": ".*", "namespace": ".*", "pod": ".*"}],
}


def _run(base: str, target: dict[str, Any], values: dict[str, str],
         now: float) -> list[dict[str, Any]]:
    expr = substitute(target["expr"], values)
    if target["instant"]:
        result = _query(base, expr, time=f"{now:.3f}")
    else:
        result = _query(base, expr, start=f"{now - 1800:.3f}", end=f"{now:.3f}", step="60")
    # What the variables select is all a query returns.
    if "node" in values and result:
        assert {r["metric"].get("node", values["node"]) for r in result} == {values["node"]}
    if "workload" in values and result:
        assert {r["metric"]["workload"] for r in result} == {values["workload"]}, expr
    return result


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_returns_series_on_the_demo_fleet(name: str, demo_prometheus: str) -> None:
    base = demo_prometheus
    board = dashboards()[name]
    now = time.time()
    for values in VALUES[name]:
        # The variables list the values the test picks.
        for variable, listed, chosen in listed_values(board, base, values):
            assert listed, variable
            assert chosen == ".*" or chosen in listed, (variable, listed)
    empty = []
    answered = 0
    for panel in panels(board):
        for target in panel.get("targets", []):
            counts = [len(_run(base, target, values, now)) for values in VALUES[name]]
            answered += bool(counts[0])
            if not any(counts):
                empty.append(f"{panel['title']} / {target['refId']}: {target['expr']}")
    assert empty == [], "\n\n".join(empty)
    # Most queries answer under the first setting already.
    assert answered >= 0.8 * sum(len(p.get("targets", [])) for p in panels(board))


class _StatedCluster(OpenMetricsWriter):
    """One cluster's own Prometheus whose exporters state the cluster
    (``--cluster-name``): ``gpu_node_info`` alone carries ``cluster``, no store label does
    (docs/metrics.md, "The cluster label")."""

    def __init__(self, of: OpenMetricsWriter) -> None:
        super().__init__()
        self.end = of.end
        self.families = {name: [line.replace("{", '{cluster="a",', 1) for line in lines]
                         if name == "gpu_node_info" else lines
                         for name, lines in of.families.items()}


@pytest.fixture(scope="module")
def demo_prometheus_stated(prometheus_bin: str, promtool: str, demo_samples: OpenMetricsWriter,
                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(prometheus_bin, promtool, _StatedCluster(demo_samples),
                      tmp_path_factory.mktemp("grafana-stated"), ())


def test_a_cluster_stated_on_gpu_node_info_alone_shows_the_cluster(
        demo_prometheus_stated: str) -> None:
    """Where only ``gpu_node_info`` has a ``cluster`` (the exporters' ``--cluster-name`` in
    the cluster's own Prometheus), the cluster variable offers no value that would narrow
    every other series away (it listed "a", and picking it emptied every panel), and the
    fleet's joins to ``gpu_node_info`` still find the nodes' instance types (they were made
    on a cluster only it has: the idle nodes' table and the idle devices per instance type
    were empty), as the price rules do."""
    base = demo_prometheus_stated
    board = dashboards()["gpuscope-fleet"]
    [variable] = [v for v in board["templating"]["list"] if v["name"] == "cluster"]
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["definition"])
    assert m, variable["definition"]
    listed = {r["metric"].get("cluster", "") for r in _query(
        base, f"group by (cluster) ({m.group(1)})")}
    assert listed == {""}, listed
    now = time.time()
    for title in ("Idle nodes", "Idle devices by instance type"):
        panel = next(p for p in panels(board) if p["title"] == title and p["type"] != "stat")
        for target in panel["targets"]:
            result = _run(base, target, {"cluster": ".*"}, now)
            assert result, (title, target["refId"], target["expr"])
            assert all(r["metric"].get("instance_type") for r in result), (title, result)


def test_the_dollars_are_the_price_table_s(demo_prometheus: str) -> None:
    """The fleet's idle $/hour is the sum of the idle nodes' prices in the price table."""
    base = demo_prometheus
    board = dashboards()["gpuscope-fleet"]
    stat = next(p for p in panels(board) if p["title"] == "Idle nodes: $/hour")
    [idle] = _query(base, substitute(stat["targets"][0]["expr"], VALUES["gpuscope-fleet"][0]))
    rules = Rules.load()
    nodes = _query(base, rules.expr("GpuNodeUnderutilized"))
    info = {r["metric"]["node"]: r["metric"]["instance_type"]
            for r in _query(base, "gpu_node_info")}
    table = bundled_prices()
    prices = [table.per_hour(info[r["metric"]["node"]]) for r in nodes]
    assert len(nodes) >= 3 and all(p is not None for p in prices), nodes
    assert float(idle["value"][1]) == pytest.approx(sum(p for p in prices if p is not None))
    per_node = {r["metric"]["node"]: float(r["value"][1]) for r in _query(base, NODE_PRICE)}
    assert per_node == {n: table.per_hour(t) for n, t in info.items()
                        if table.per_hour(t) is not None}


def test_the_kustomize_component_provisions_them_for_the_sidecar() -> None:
    from tests.deploy.render import render

    maps = {o["metadata"]["name"]: o for o in render("eks-grafana-dashboards")
            if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]}
    assert set(maps) == {n.replace("gpuscope-", "gpuscope-grafana-") for n in DASHBOARDS}
    for name, cm in maps.items():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "gpuscope"
        assert cm["metadata"]["namespace"] == "gpuscope"
        [(key, text)] = cm["data"].items()
        assert (GENERATED / key).read_text(encoding="utf-8") == text, name
    # Without the component, no dashboard.
    assert not [o for o in render("eks") if o["kind"] == "ConfigMap"
                and "grafana_dashboard" in o["metadata"].get("labels", {})]


def test_the_heatmap_uses_the_dashboard_recording_rules_where_loaded() -> None:
    data = load_rules()
    heatmap_expr = next(t["expr"] for p in panels(DASHBOARDS["gpuscope-fleet"](Rules(data)))
                        if p["type"] == "heatmap" for t in p["targets"])
    data["groups"].append({"name": "gpuscope-dashboard", "rules": [
        {"record": "node:gpu_busy_ratio:avg1m", "expr": "vector(1)"}]})
    with_rules = next(t["expr"] for p in panels(DASHBOARDS["gpuscope-fleet"](Rules(data)))
                      if p["type"] == "heatmap" for t in p["targets"])
    assert with_rules == (
        'label_replace(\nlabel_join(\navg_over_time(node:gpu_busy_ratio:avg1m{cluster=~"$cluster"}'
        '[$__rate_interval]),\n"cluster_node", "/", "cluster", "node"),\n'
        '"cluster_node", "$1", "cluster_node", "/(.*)")')
    assert with_rules != heatmap_expr


def test_mig_slices_show_as_devices_with_their_own_work_signals(demo_prometheus: str) -> None:
    board = dashboards()["gpuscope-node"]
    values = VALUES["gpuscope-node"][0]
    now = time.time()
    by_title = {p["title"]: p for p in panels(board)}
    devices = _run(demo_prometheus, by_title["Devices"]["targets"][0], values, now)
    # (Prometheus leaves out empty labels: a whole GPU has no parent_uuid.)
    slices = {r["metric"]["gpu"]: r["metric"] for r in devices if "parent_uuid" in r["metric"]}
    parents = {r["metric"]["uuid"]: r["metric"]["gpu"] for r in devices
               if "parent_uuid" not in r["metric"]}
    assert sorted(slices) == ["6/1", "6/2", "7/1", "7/2"]
    assert {parents[m["parent_uuid"]] for m in slices.values()} == {"6", "7"}
    assert slices["7/1"]["mig_profile"] == "4g.40gb"
    # GPM per MIG instance: each slice has its own SM activity series, labelled with its
    # profile; the busy slice reads work, the idle notebook's slice none.
    sm = {r["metric"]["gpu"]: r for r in _run(
        demo_prometheus, by_title["SM activity (GPM)"]["targets"][0], values, now)}
    assert set(slices) <= set(sm)
    assert sm["6/1"]["metric"]["mig_profile"] == "3g.40gb"
    # The median point, not the last: the data ends before the test's now, and the last
    # step's rate window reaches past the last sample, where Prometheus extrapolates only
    # half an interval and reads the busy slice low (0.49 seen in one run).
    assert statistics.median(float(v) for _, v in sm["6/1"]["values"]) > 0.5
    assert max(float(v) for _, v in sm["6/2"]["values"]) < 0.05
    # The fleet heatmap has a row for every node of the demo fleet.
    fleet = dashboards()["gpuscope-fleet"]
    heat = next(p for p in panels(fleet) if p["type"] == "heatmap")
    rows = _run(demo_prometheus, heat["targets"][0], {"cluster": ".*"}, now)
    assert len(rows) == len(list((REPO / "dashboard" / "demo").glob("*.yaml")))


def test_allocated_idle_dollars_are_the_held_gpus_share_of_their_node(
        demo_prometheus: str) -> None:
    base = demo_prometheus
    board = dashboards()["gpuscope-pods"]
    stat = next(p for p in panels(board) if p["title"] == "Allocated-idle: $/hour")
    [got] = _query(base, substitute(stat["targets"][0]["expr"], VALUES["gpuscope-pods"][0]))
    rows = _query(base, Rules.load().expr("GpuAllocatedButIdle"))
    gpus = {r["metric"]["node"]: int(float(r["value"][1]))
            for r in _query(base, 'count by (node) (gpu_info{parent_uuid=""})')}
    shared = {(r["metric"]["node"], r["metric"]["uuid"])
              for r in _query(base, "uuid:container_gpu_sharing:count > 1")}
    info = {r["metric"]["node"]: r["metric"]["instance_type"]
            for r in _query(base, "gpu_node_info")}
    table = bundled_prices()
    expected = 0.0
    whole = 0
    for r in rows:
        node, uuid = r["metric"]["node"], r["metric"]["uuid"]
        price = table.per_hour(info[node])
        if uuid.startswith("GPU-") and (node, uuid) not in shared and price is not None:
            expected += price / gpus[node]
            whole += 1
    assert whole >= 2  # the demo's p4d node (2 held, unused) and the g6 dev pod
    assert float(got["value"][1]) == pytest.approx(expected)


def _by_labels(result: list[dict[str, Any]], where: str) -> dict[str, dict[float, float]]:
    """Each series' points by timestamp, by its labels but the replica label; a series
    that comes twice (once per replica) fails."""
    out: dict[str, dict[float, float]] = {}
    for r in result:
        key = json.dumps({k: v for k, v in r["metric"].items() if k != "prometheus_replica"},
                         sort_keys=True)
        assert key not in out, (where, "a series twice", key)
        points = r["values"] if "values" in r else [r["value"]]
        out[key] = {float(t): float(v) for t, v in points}
    return out


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_an_ha_pair_s_two_copies_count_once(name: str, demo_prometheus: str,
                                            demo_prometheus_ha: str) -> None:
    """Every query answers the same series, with the same values, whether the store holds
    each raw series once or twice (an HA pair written into a store that keeps both, the
    rules evaluated once): no GPU, container, throttled second or byte counted twice."""
    board = dashboards()[name]
    now = time.time()
    values = VALUES[name][0]
    for panel in panels(board):
        for target in panel.get("targets", []):
            once = _run(demo_prometheus, target, values, now)
            twice = _run(demo_prometheus_ha, target, values, now)
            where = f"{panel['title']} / {target['refId']}"
            a, b = _by_labels(once, where), _by_labels(twice, where)
            assert a.keys() == b.keys(), where
            for key in a:
                # At the steps both have (recorded series begin when each server started),
                # the same values. (The two servers evaluated the rules a second or so
                # apart.)
                common = sorted(a[key].keys() & b[key].keys())
                assert common, (where, key)
                assert [b[key][t] for t in common] == pytest.approx(
                    [a[key][t] for t in common], rel=0.1, abs=1e-9), (where, key)
