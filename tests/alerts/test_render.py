"""The PrometheusRule is generated from the rule file, validated, and checked in up to date."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscope.alerts import render
from gpuscope.alerts.render import (
    GENERATED_FILE,
    RenderError,
    cap_for,
    dump_yaml,
    load_rules,
    parse_duration,
    prometheus_rule,
    render_generated,
    validate_prometheus_rule,
)
from tests.alerts.conftest import REPO, run_with_a_disk_that_fills


def generated() -> dict[str, Any]:
    data = yaml.safe_load(GENERATED_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_checked_in_prometheusrule_is_up_to_date() -> None:
    assert GENERATED_FILE.read_text(encoding="utf-8") == render_generated(), (
        "alerts/generated/prometheusrule.yaml is out of date: run python -m gpuscope.alerts.render")
    result = subprocess.run([sys.executable, "-m", "gpuscope.alerts.render", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_prometheusrule_structure_and_content_come_from_the_rule_file() -> None:
    obj = generated()
    assert validate_prometheus_rule(obj) == []
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["name"] == "gpuscope"
    assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "gpuscope"
    assert "namespace" not in obj["metadata"]  # the kustomization sets it
    assert obj["spec"]["groups"] == load_rules()["groups"]


def test_prometheusrule_groups_pass_promtool(promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "from-prometheusrule.yaml"
    rules.write_text(dump_yaml({"groups": generated()["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(g["rules"]) for g in load_rules()["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def _broken(change: str) -> dict[str, Any]:
    obj = copy.deepcopy(generated())
    group = obj["spec"]["groups"][1]
    alert = group["rules"][0]
    if change == "apiVersion":
        obj["apiVersion"] = "monitoring.coreos.com/v1alpha1"
    elif change == "kind":
        obj["kind"] = "PrometheusRules"
    elif change == "name":
        obj["metadata"]["name"] = "GPUscope_rules"
    elif change == "label-value":
        obj["metadata"]["labels"]["team"] = 7
    elif change == "no-groups":
        obj["spec"]["groups"] = []
    elif change == "duplicate-group":
        # Right after the original: the error's index does not depend on how many follow.
        obj["spec"]["groups"].insert(2, copy.deepcopy(group))
    elif change == "both-alert-and-record":
        alert["record"] = "x:y:z"
    elif change == "no-expr":
        del alert["expr"]
    elif change == "bad-for":
        alert["for"] = "1 hour"
    elif change == "unknown-rule-key":
        alert["severity"] = "warning"
    elif change == "annotation-not-string":
        alert["annotations"]["summary"] = ["a", "list"]
    elif change == "record-with-for":
        obj["spec"]["groups"][0]["rules"][0]["for"] = "5m"
    elif change == "bad-record-name":
        obj["spec"]["groups"][0]["rules"][0]["record"] = "node gpu"
    elif change == "unknown-top-key":
        obj["status"] = {}
    return obj


@pytest.mark.parametrize(("change", "error"), [
    ("apiVersion", "apiVersion: expected 'monitoring.coreos.com/v1'"),
    ("kind", "kind: expected 'PrometheusRule'"),
    ("name", "metadata.name: not a DNS subdomain name"),
    ("label-value", "metadata.labels.team: expected a string"),
    ("no-groups", "spec.groups: expected a non-empty list"),
    ("duplicate-group", "spec.groups[2].name: duplicate group name 'gpuscope.alerts'"),
    ("both-alert-and-record", "spec.groups[1].rules[0]: expected exactly one of"),
    ("no-expr", "spec.groups[1].rules[0].expr: expected a PromQL expression"),
    ("bad-for", "spec.groups[1].rules[0].for: not a Prometheus duration"),
    ("unknown-rule-key", "spec.groups[1].rules[0].severity: unknown key"),
    ("annotation-not-string", "spec.groups[1].rules[0].annotations.summary: expected a string"),
    ("record-with-for", "spec.groups[0].rules[0].for: only alerting rules have it"),
    ("bad-record-name", "spec.groups[0].rules[0].record: not a metric name"),
    ("unknown-top-key", "status: unknown key"),
])
def test_schema_check_finds_each_kind_of_mistake(change: str, error: str) -> None:
    errors = validate_prometheus_rule(_broken(change))
    assert any(e.startswith(error) for e in errors), errors


def test_runbook_base_makes_links_absolute() -> None:
    obj = prometheus_rule(load_rules(), runbook_base="https://git.example.com/gpuscope/blob/main/")
    urls = [r["annotations"]["runbook_url"] for g in obj["spec"]["groups"] for r in g["rules"]
            if "alert" in r]
    assert "https://git.example.com/gpuscope/blob/main/docs/alerts.md#gpulost" in urls
    assert all(u.startswith("https://git.example.com/gpuscope/blob/main/docs/alerts.md#")
               for u in urls)


@pytest.mark.parametrize(("base", "message"), [
    ("docs", "expected an http(s) URL"),
    ("ftp://git.example.com/", "expected an http(s) URL"),
    ("https://", "expected an http(s) URL"),
    ("https://git.example.com/?ref=main", "without a query or fragment"),
    ("https://git.example.com/#main", "without a query or fragment"),
    ("https://git.example.com/my repo/", "expected an http(s) URL"),
    ("https://git.example.com:99999/", "bad port"),
    ("https://[::1/", "not a URL"),
    ("https://admin:hunter2@git.example.com/", "must not hold credentials"),
])
def test_render_bad_runbook_base_is_one_line_and_exit_2(
    base: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--runbook-base is put in front of every runbook_url: anything but an http(s) URL
    (without a password, which would be in every alert, or a query or fragment, which the
    path would go into) is one line, and nothing is written."""
    assert render.main(["--runbook-base", base, "--output", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("gpuscope-render: error: argument --runbook-base: "), err
    assert message in err
    assert "hunter2" not in err


def test_cap_for_shortens_long_durations_only() -> None:
    rules = load_rules()
    capped = cap_for(rules, "2m")
    durations = {r["alert"]: r.get("for") for g in capped["groups"] for r in g["rules"]
                 if "alert" in r}
    assert durations["GpuNodeUnderutilized"] == "2m"
    assert durations["GpuLost"] == "1m"  # already shorter
    assert durations["GpuEccUncorrected"] is None  # no for: at all
    assert load_rules() == rules  # the source is untouched


@pytest.mark.parametrize(("text", "seconds"), [
    ("1h", 3600), ("30m", 1800), ("1h30m", 5400), ("500ms", 0.5), ("2d", 172800), ("0", 0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1 h", "h", "1.5h", "-1m", "1m1h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(RenderError):
        parse_duration(text)


def test_render_check_reports_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "prometheusrule.yaml"
    assert render.main(["--output", str(out)]) == 0
    assert render.main(["--output", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("for: 1h", "for: 2h"))
    assert render.main(["--output", str(out), "--check"]) == 1


def test_render_check_with_stdout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--check -o - wrote the rendering to stdout and exited 0: a check that always passed."""
    assert render.main(["--output", "-", "--check"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("gpuscope-render: error: --check compares with a file: give "
                            "--output FILE, not -\n")


def test_render_check_of_a_file_not_utf8_or_endless_says_out_of_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check read the whole output file as UTF-8: a file that is not was a
    UnicodeDecodeError traceback, and /dev/zero took all memory."""
    out = tmp_path / "prometheusrule.yaml"
    out.write_bytes(b"\xff\xfe not the rules\n")
    for path in (str(out), "/dev/zero"):
        assert render.main(["--output", path, "--check"]) == 1
        assert capsys.readouterr().err == (f"gpuscope-render: {path} is out of date: run "
                                           "python -m gpuscope.alerts.render\n")


@pytest.mark.parametrize(("content", "message"), [
    ("groups: [", "invalid YAML"),
    ("rules: []\n", "expected a mapping with exactly one key, 'groups'"),
    ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        for: soon\n",
     "groups[0].rules[0].for: not a Prometheus duration: 'soon'"),
])
def test_render_bad_rule_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str, message: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.render", "--rules", str(rules), "--output", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("gpuscope-render: error: ")
    assert message in result.stderr


@pytest.mark.parametrize(("content", "message"), [
    (b"\xfc\x00\x81binary", "not UTF-8 text"),
    (b"groups: " + b"[" * 100_000, "nested too deeply"),
    (b"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n"
     b"        expr: vector(1)\n", "duplicate key 'expr'"),
    (b"groups: []\n" + b"#" * (17 << 20), "larger than 16 MiB"),
])
def test_render_unreadable_rule_file_is_one_line_and_exit_2(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """Binary garbage, a file nested past the parser's stack, a duplicate key (promtool
    refuses it; PyYAML kept the last) and a file too large for a rule file: one line each,
    as for any other bad rule file."""
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.alerts.render", "--rules", str(rules), "--output", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr[-300:]
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr[-300:]
    assert result.stderr.startswith("gpuscope-render: error: ")
    assert message in result.stderr


@pytest.mark.parametrize("where", ["folder", "under-a-file"])
def test_render_unwritable_output_is_one_line_and_exit_2(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--output naming a folder, or a path under a file: one error line, not an
    IsADirectoryError / NotADirectoryError traceback."""
    out = tmp_path if where == "folder" else tmp_path / "rules.yaml" / "out.yaml"
    (tmp_path / "rules.yaml").write_text("not a folder\n")
    assert render.main(["--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gpuscope-render: error: {out}: cannot write: "), err


def test_render_failed_write_leaves_the_old_output_whole(tmp_path: Path) -> None:
    """--output is written through a temporary file in its folder: a write that fails
    part-way (a file-size limit, as a full disk) is one error line and the old file is
    still there whole, no temporary file beside it; a write that succeeds keeps the old
    file's permissions."""
    out = tmp_path / "prometheusrule.yaml"
    out.write_text("# the old output\n")
    out.chmod(0o640)
    result = run_with_a_disk_that_fills(
        ["-m", "gpuscope.alerts.render", "--output", str(out)], limit=4 << 10)
    assert result.returncode == 2, result.stderr[-300:]
    assert len(result.stderr.splitlines()) == 1, result.stderr[-300:]
    assert result.stderr.startswith(f"gpuscope-render: error: {out}: cannot write: ")
    assert out.read_text() == "# the old output\n"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    assert render.main(["--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_generated()
    assert out.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_cap_ranges_shortens_range_selectors_and_offsets() -> None:
    from gpuscope.alerts.render import cap_ranges

    rules = {"groups": [{"name": "g", "rules": [
        {"record": "a", "expr": "rate(x[5m]) or max_over_time(y[6h]) or z[2s] or w offset 10m"
                                " or v offset 5s"},
    ]}]}
    capped = cap_ranges(rules, "10s")
    assert capped["groups"][0]["rules"][0]["expr"] == (
        "rate(x[10s]) or max_over_time(y[10s]) or z[2s] or w offset 10s or v offset 5s")
    assert rules["groups"][0]["rules"][0]["expr"].startswith("rate(x[5m])")  # a copy


def test_label_values_prometheus_reads_as_text_load_as_strings(tmp_path: Path) -> None:
    """YAML 1.1's booleans, octal and sexagesimal numbers, dates and ``=`` are text to
    Prometheus (and YAML 1.2): a rule file with such label values, which promtool accepts,
    loads with them as written (a date and ``=`` were a date and an error)."""
    values = ["on", "yes", "No", "0755", "1:30", "2024-01-01", "2001-12-14t21:59:43.10-05:00", "="]
    labels = "".join(f"          l{i}: {v}\n" for i, v in enumerate(values))
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n"
                     "        expr: up == 0\n        labels:\n" + labels)
    loaded = render.load_rules(rules)["groups"][0]["rules"][0]["labels"]
    assert loaded == {f"l{i}": v for i, v in enumerate(values)}
