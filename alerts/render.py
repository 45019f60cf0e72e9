"""Render ``alerts/gpuscope-rules.yaml`` as a Prometheus Operator ``PrometheusRule``.

The rule file is the one source. ``python -m gpuscope.alerts.render`` writes
``alerts/generated/prometheusrule.yaml`` from it (checked in, never edited by hand);
``--check`` fails when the checked-in file is out of date. ``--cluster-label NAME`` renders the
rules with the cluster label called ``NAME`` instead of ``cluster`` (kubernetes-mixin's
``clusterLabel``), ``--replica-labels A,B`` with those HA replica labels collapsed instead of
``prometheus_replica,__replica__,replica`` (:func:`relabel_rules`); ``--format rules`` writes a
plain Prometheus rule file (Thanos Ruler, Mimir's or Cortex's ruler, vmalert) instead of the
``PrometheusRule``. The same module gives tests a copy
of the rules with every ``for:`` capped (:func:`cap_for`) and every range selector shortened
(:func:`cap_ranges`: a 5-minute rate of a series seconds old reads low), so a test never keeps
a second, hand-edited rule set.

Bad input (an unreadable or invalid rule file, a bad flag, an output that cannot be
written) ends in one ``gpuscope-render: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.nodes import ScalarNode

from gpuscope.alerts.grafana.promql import rename_label
from gpuscope.exporter import yaml12
from gpuscope.exporter.files import TooLarge, read_text, write_text_atomic

ALERTS_DIR = Path(__file__).resolve().parent
RULES_FILE = ALERTS_DIR / "gpuscope-rules.yaml"
GENERATED_FILE = ALERTS_DIR / "generated" / "prometheusrule.yaml"

API_VERSION = "monitoring.coreos.com/v1"
KIND = "PrometheusRule"
DEFAULT_NAME = "gpuscope"
DEFAULT_LABELS: dict[str, str] = {
    "app.kubernetes.io/name": "gpuscope",
    "app.kubernetes.io/component": "alerts",
    "app.kubernetes.io/part-of": "gpuscope",
}

# Prometheus' duration syntax, as the PrometheusRule CRD validates it.
_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_DURATION_UNITS = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0,
                   "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_PART = re.compile(r"([0-9]+)(ms|y|w|d|h|m|s)")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RECORD_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_K8S_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

#: The label that names a node's cluster in the rule file, and the HA replica labels its
#: ``max without (...)`` lists collapse, as written there (the generator renames them).
DEFAULT_CLUSTER_LABEL = "cluster"
DEFAULT_REPLICA_LABELS: tuple[str, ...] = ("prometheus_replica", "__replica__", "replica")

_GROUP_KEYS = {"name", "interval", "rules", "limit", "partial_response_strategy",
               "query_offset"}
_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_TOP_KEYS = {"apiVersion", "kind", "metadata", "spec"}
_METADATA_KEYS = {"name", "namespace", "labels", "annotations"}


class RenderError(Exception):
    """A rule file or generated object that is not valid; ``str()`` is one line."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1h30m`` or ``500ms``."""
    if not isinstance(text, str) or not text or not _DURATION.match(text):
        raise RenderError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))


#: The largest rule file read, in bytes (the bundled one is under 100 KiB): a wrong path
#: (``/dev/zero``, a log) is one error line, not the machine's memory.
MAX_RULES_BYTES = 16 << 20


def read_rules_text(path: Path) -> str:
    """The rule file's text; anything that cannot be read as one (missing, a folder, not
    UTF-8, too large) raises :class:`RenderError`, one line."""
    try:
        return read_text(path, MAX_RULES_BYTES)
    except TooLarge as exc:
        raise RenderError(f"{path}: {exc}") from None
    except OSError as exc:
        raise RenderError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RenderError(f"{path}: cannot read: not UTF-8 text") from None
    except ValueError as exc:  # "embedded null byte" in the path
        raise RenderError(f"{path!r}: cannot read: {exc}") from None


def parse_rules(text: str, where: Path | str) -> dict[str, Any]:
    """A rule file's text as data (``{"groups": [...]}``), checked with
    :func:`rule_group_errors`. Read as the programs read their YAML
    (:mod:`gpuscope.exporter.yaml12`): a duplicate key is an error, as promtool makes it
    (PyYAML's own loader kept the last one silently), and nesting past the parser's stack
    is one error line, not a RecursionError."""
    try:
        data = yaml12.load(text, str(where))
    except yaml12.YamlError as exc:
        raise RenderError(str(exc)) from None
    if not isinstance(data, dict) or set(data) != {"groups"}:
        raise RenderError(f"{where}: expected a mapping with exactly one key, 'groups'")
    errors = rule_group_errors(data["groups"], where="groups")
    if errors:
        raise RenderError(f"{where}: {errors[0]}")
    return data


def load_rules(path: Path = RULES_FILE) -> dict[str, Any]:
    """The rule file as data (``{"groups": [...]}``), checked with :func:`rule_group_errors`."""
    return parse_rules(read_rules_text(path), path)


def rule_group_errors(groups: object, where: str = "spec.groups") -> list[str]:
    """Problems in a list of rule groups, each one line naming its path; empty when valid."""
    errors: list[str] = []
    if not isinstance(groups, list) or not groups:
        return [f"{where}: expected a non-empty list of groups"]
    names: set[str] = set()
    for gi, group in enumerate(groups):
        at = f"{where}[{gi}]"
        if not isinstance(group, dict):
            errors.append(f"{at}: expected a mapping")
            continue
        errors += [f"{at}.{k}: unknown key" for k in sorted(set(group) - _GROUP_KEYS)]
        name = group.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{at}.name: expected a non-empty string")
        elif name in names:
            errors.append(f"{at}.name: duplicate group name {name!r}")
        else:
            names.add(name)
        if "interval" in group:
            errors += _duration_errors(group["interval"], f"{at}.interval")
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            errors.append(f"{at}.rules: expected a non-empty list of rules")
            continue
        for ri, rule in enumerate(rules):
            errors += _rule_errors(rule, f"{at}.rules[{ri}]")
    return errors


def _rule_errors(rule: object, at: str) -> list[str]:
    if not isinstance(rule, dict):
        return [f"{at}: expected a mapping"]
    errors = [f"{at}.{k}: unknown key" for k in sorted(set(rule) - _RULE_KEYS)]
    is_alert, is_record = "alert" in rule, "record" in rule
    if is_alert == is_record:
        errors.append(f"{at}: expected exactly one of 'alert' and 'record'")
    elif is_record:
        record = rule["record"]
        if not isinstance(record, str) or not _RECORD_NAME.match(record):
            errors.append(f"{at}.record: not a metric name: {record!r}")
        for key in ("for", "keep_firing_for", "annotations"):
            if key in rule:
                errors.append(f"{at}.{key}: only alerting rules have it")
    else:
        alert = rule["alert"]
        if not isinstance(alert, str) or not alert:
            errors.append(f"{at}.alert: expected a non-empty string")
    expr = rule.get("expr")
    if isinstance(expr, bool) or not isinstance(expr, (str, int)) or expr == "":
        errors.append(f"{at}.expr: expected a PromQL expression")
    for key in ("for", "keep_firing_for"):
        if key in rule:
            errors += _duration_errors(rule[key], f"{at}.{key}")
    for key in ("labels", "annotations"):
        if key in rule:
            errors += _string_map_errors(rule[key], f"{at}.{key}", _LABEL_NAME)
    return errors


def _duration_errors(value: object, at: str) -> list[str]:
    if isinstance(value, str) and value and _DURATION.match(value):
        return []
    return [f"{at}: not a Prometheus duration: {value!r}"]


def _string_map_errors(value: object, at: str, key_pattern: re.Pattern[str]) -> list[str]:
    if not isinstance(value, dict):
        return [f"{at}: expected a mapping of strings"]
    errors = []
    for k, v in value.items():
        if not isinstance(k, str) or not key_pattern.match(k):
            errors.append(f"{at}: invalid key {k!r}")
        if not isinstance(v, str):
            errors.append(f"{at}.{k}: expected a string, got {type(v).__name__}")
    return errors


def validate_prometheus_rule(obj: object) -> list[str]:
    """A minimal schema check of a PrometheusRule (what the CRD's OpenAPI schema requires of
    the fields this project uses); returns the problems, empty when valid."""
    if not isinstance(obj, dict):
        return ["expected a mapping"]
    errors = [f"{k}: unknown key" for k in sorted(set(obj) - _TOP_KEYS)]
    if obj.get("apiVersion") != API_VERSION:
        errors.append(f"apiVersion: expected {API_VERSION!r}, got {obj.get('apiVersion')!r}")
    if obj.get("kind") != KIND:
        errors.append(f"kind: expected {KIND!r}, got {obj.get('kind')!r}")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        errors.append("metadata: expected a mapping")
    else:
        errors += [f"metadata.{k}: unknown key" for k in sorted(set(metadata) - _METADATA_KEYS)]
        name = metadata.get("name")
        if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            errors.append(f"metadata.name: not a DNS subdomain name: {name!r}")
        if "namespace" in metadata:
            ns = metadata["namespace"]
            if not isinstance(ns, str) or len(ns) > 63 or not _DNS_SUBDOMAIN.match(ns) or "." in ns:
                errors.append(f"metadata.namespace: not a DNS label: {ns!r}")
        for key in ("labels", "annotations"):
            if key in metadata:
                errors += _string_map_errors(metadata[key], f"metadata.{key}", _K8S_LABEL_KEY)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errors.append("spec: expected a mapping")
    else:
        errors += [f"spec.{k}: unknown key" for k in sorted(set(spec) - {"groups"})]
        errors += rule_group_errors(spec.get("groups"))
    return errors


def prometheus_rule(
    rules: Mapping[str, Any],
    *,
    name: str = DEFAULT_NAME,
    labels: Mapping[str, str] | None = None,
    runbook_base: str | None = None,
) -> dict[str, Any]:
    """The PrometheusRule object for ``rules`` (as :func:`load_rules` returns them).

    ``runbook_base`` is put in front of every relative ``runbook_url`` (e.g. the URL of the
    repository's tree, so that ``docs/alerts.md#gpulost`` becomes a link)."""
    groups = copy.deepcopy(list(rules["groups"]))
    if runbook_base:
        for group in groups:
            for rule in group["rules"]:
                url = rule.get("annotations", {}).get("runbook_url")
                if isinstance(url, str) and "://" not in url:
                    rule["annotations"]["runbook_url"] = runbook_base.rstrip("/") + "/" + url
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": dict(DEFAULT_LABELS if labels is None else labels)},
        "spec": {"groups": groups},
    }
    errors = validate_prometheus_rule(obj)
    if errors:
        raise RenderError(errors[0])
    return obj


def cap_for(rules: Mapping[str, Any], limit: str) -> dict[str, Any]:
    """A copy of ``rules`` with every ``for:`` longer than ``limit`` set to ``limit`` (tests
    run the real rules with short durations)."""
    cap = parse_duration(limit)
    out = copy.deepcopy(dict(rules))
    for group in out["groups"]:
        for rule in group["rules"]:
            if "for" in rule and parse_duration(rule["for"]) > cap:
                rule["for"] = limit
    return out


_RANGE = re.compile(r"\[([0-9]+(?:ms|[smhdwy]))\]")
_OFFSET = re.compile(r"\boffset ([0-9]+(?:ms|[smhdwy]))\b")


def cap_ranges(rules: Mapping[str, Any], limit: str) -> dict[str, Any]:
    """A copy of ``rules`` with every range selector and offset longer than ``limit``
    (``[5m]``, ``[6h]``, ``offset 5m``) shortened to it (tests run the real rules for
    seconds)."""
    cap = parse_duration(limit)

    def shorten_range(m: re.Match[str]) -> str:
        return f"[{limit}]" if parse_duration(m.group(1)) > cap else m.group(0)

    def shorten_offset(m: re.Match[str]) -> str:
        return f"offset {limit}" if parse_duration(m.group(1)) > cap else m.group(0)

    out = copy.deepcopy(dict(rules))
    for group in out["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _OFFSET.sub(shorten_offset, _RANGE.sub(shorten_range, rule["expr"]))
    return out


# PromQL tokens, as far as naming a rule's identifiers needs them: string literals and
# comments are skipped; an identifier is a label or metric name, a keyword or a function.
# (A label is renamed by :func:`~gpuscope.alerts.grafana.promql.rename_label`.)
_PROMQL_TOKEN = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)"""
    r"""|(?P<comment>\#[^\n]*)"""
    r"""|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)"""
    r"""|(?P<number>[0-9.][0-9A-Za-z_.]*)"""
    r"""|(?P<other>.)""",
    re.DOTALL,
)
_WITHOUT = re.compile(r"\bwithout(\s*)\(([^()]*)\)")


def _identifiers(expr: str) -> set[str]:
    return {m.group() for m in _PROMQL_TOKEN.finditer(expr) if m.lastgroup == "ident"}


def _rename_replicas(expr: str, old: Sequence[str], new: Sequence[str]) -> str:
    """``expr`` with every ``without (...)`` list that is ``old``, or ends with it (``without
    (instance, job, <old>)``: the alerts keyed by a device or container, not by the exporter
    pod's address), made ``new`` there."""

    def swap(m: re.Match[str]) -> str:
        labels = [x.strip() for x in m.group(2).split(",") if x.strip()]
        keep = len(labels) - len(old)
        if not old or keep < 0 or labels[keep:] != list(old):
            return m.group(0)
        return f"without{m.group(1)}({', '.join([*labels[:keep], *new])})"

    return _WITHOUT.sub(swap, expr)


def runbook_base_url(value: str) -> str:
    """``--runbook-base``: an http(s) URL with a host, put in front of every relative
    ``runbook_url`` (``BASE/docs/alerts.md#gpulost``), so no ``user:password@`` (it would
    be in every alert's annotations), no query or fragment (the path goes after it) and no
    white space. ``argparse.ArgumentTypeError`` otherwise, one line."""
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise argparse.ArgumentTypeError(f"not a URL: {exc}") from None
    if parts.username is not None:  # first: the messages below repeat the value
        raise argparse.ArgumentTypeError(
            "the URL must not hold credentials (user:password@): it is put in every alert")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad port in {value!r}") from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or "?" in value
            or "#" in value or not value.isprintable() or any(c.isspace() for c in value)):
        raise argparse.ArgumentTypeError(
            "expected an http(s) URL without a query or fragment such as "
            f"https://git.example.com/gpuscope/blob/main/, got {value!r}")
    return value


def label_list(text: str) -> tuple[str, ...]:
    """A flag's comma-separated label names (``A,B``), blanks dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def relabel_rules(
    rules: Mapping[str, Any],
    cluster_label: str = DEFAULT_CLUSTER_LABEL,
    replica_labels: Sequence[str] = DEFAULT_REPLICA_LABELS,
) -> dict[str, Any]:
    """A copy of ``rules`` with the cluster label called ``cluster_label`` and the HA replica
    labels ``replica_labels`` (empty: none, for a store that deduplicates): in every
    expression, and in annotations' ``$labels.cluster`` and ``cluster=`` matchers of their
    queries. ``RenderError`` for a name that is not a label name, that the rules already use
    for something else, or that is both the cluster label and a replica label."""
    replicas = tuple(replica_labels)
    for name in (cluster_label, *replicas):
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            raise RenderError(f"not a label name: {name!r}")
    if cluster_label.startswith("__"):
        raise RenderError(f"--cluster-label: {cluster_label!r} is reserved (starts with __)")
    if len(set(replicas)) != len(replicas):
        raise RenderError(f"--replica-labels: a label appears twice: {', '.join(replicas)}")
    if cluster_label in replicas:
        raise RenderError(f"{cluster_label!r} cannot be both the cluster label and a replica "
                          "label")
    used: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            used |= _identifiers(str(rule["expr"]))
    used -= {DEFAULT_CLUSTER_LABEL, *DEFAULT_REPLICA_LABELS}
    for flag, names in (("--cluster-label", (cluster_label,)), ("--replica-labels", replicas)):
        taken = [n for n in names if n in used]
        if taken:
            raise RenderError(f"{flag}: {taken[0]!r} is already a label, metric or keyword of "
                              "the rules")
    out = copy.deepcopy(dict(rules))
    if cluster_label == DEFAULT_CLUSTER_LABEL and replicas == DEFAULT_REPLICA_LABELS:
        return out
    own_label = re.compile(r"\$labels\." + DEFAULT_CLUSTER_LABEL + r"\b")
    own_matcher = re.compile(r"\b" + DEFAULT_CLUSTER_LABEL + r"(?=\s*(?:=|!=|=~|!~))")
    for group in out["groups"]:
        for rule in group["rules"]:
            expr = _rename_replicas(str(rule["expr"]), DEFAULT_REPLICA_LABELS, replicas)
            rule["expr"] = rename_label(expr, DEFAULT_CLUSTER_LABEL, cluster_label)
            annotations = rule.get("annotations", {})
            for key, text in annotations.items():
                text = own_label.sub("$labels." + cluster_label, text)
                annotations[key] = own_matcher.sub(cluster_label, text)
    return out


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL), lists indented under their key, no
    anchors: the output reads like the hand-written source."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(obj: object, header: str = "") -> str:
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16,
                     default_flow_style=False)
    lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return lines + body


GENERATED_HEADER = """\
Generated from alerts/gpuscope-rules.yaml by `python -m gpuscope.alerts.render`: do not edit.
Change the rule file and run the command again (a test fails while this file is out of date)."""


RULES_HEADER = """\
Generated from alerts/gpuscope-rules.yaml by `python -m gpuscope.alerts.render --format rules`."""


def render_generated(
    rules_file: Path = RULES_FILE,
    runbook_base: str | None = None,
    *,
    cluster_label: str = DEFAULT_CLUSTER_LABEL,
    replica_labels: Sequence[str] = DEFAULT_REPLICA_LABELS,
    fmt: str = "prometheusrule",
) -> str:
    """The text of ``alerts/generated/prometheusrule.yaml`` (with the defaults), or of the
    rules as a plain rule file (``fmt="rules"``), the cluster and replica labels renamed."""
    rules = relabel_rules(load_rules(rules_file), cluster_label, replica_labels)
    obj = prometheus_rule(rules, runbook_base=runbook_base)
    if fmt == "rules":
        return dump_yaml({"groups": obj["spec"]["groups"]}, RULES_HEADER)
    return dump_yaml(obj, GENERATED_HEADER)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise RenderError(message)


def _parser() -> _Parser:
    p = _Parser(prog="gpuscope-render",
                description="Render the gpuscope rule file as a PrometheusRule.")
    p.add_argument("--rules", type=Path, default=RULES_FILE, help="rule file to render")
    p.add_argument("--output", "-o", type=Path, default=GENERATED_FILE,
                   help="where to write the PrometheusRule ('-' for stdout)")
    p.add_argument("--runbook-base", type=runbook_base_url, default=None, metavar="URL",
                   help="http(s) URL put in front of relative runbook_url annotations")
    p.add_argument("--cluster-label", default=DEFAULT_CLUSTER_LABEL, metavar="NAME",
                   help="the label that names a node's cluster in your store (default: "
                        "%(default)s)")
    p.add_argument("--replica-labels", type=label_list, metavar="A,B,...",
                   default=DEFAULT_REPLICA_LABELS,
                   help="HA replica labels whose copies of a series count once (default: "
                        f"{','.join(DEFAULT_REPLICA_LABELS)}; empty: none)")
    p.add_argument("--format", choices=("prometheusrule", "rules"), default="prometheusrule",
                   help="a PrometheusRule (default) or a plain Prometheus rule file")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the output file is not up to date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.check and str(args.output) == "-":
            raise RenderError("--check compares with a file: give --output FILE, not -")
        text = render_generated(args.rules, args.runbook_base,
                                cluster_label=args.cluster_label,
                                replica_labels=args.replica_labels, fmt=args.format)
    except RenderError as exc:
        print(f"gpuscope-render: error: {exc}", file=sys.stderr)
        return 2
    out: Path = args.output
    if str(out) == "-":
        sys.stdout.write(text)
        return 0
    if args.check:
        # No more than it could hold (CRLF line ends read as LF, as text mode reads them),
        # and bytes that are not UTF-8 replaced: a file that is not UTF-8, or endless
        # (/dev/zero), is out of date, not a traceback or all the memory.
        try:
            with out.open("rb") as f:
                raw = f.read(2 * len(text.encode("utf-8")) + 1)
            current: str | None = raw.decode("utf-8", "replace").replace(
                "\r\n", "\n").replace("\r", "\n")
        except OSError:
            current = None
        if current != text:
            print(f"gpuscope-render: {out} is out of date: run python -m gpuscope.alerts.render",
                  file=sys.stderr)
            return 1
        return 0
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)  # a failed write leaves the old file whole
    except OSError as exc:  # a folder, a path under a file, a full or read-only disk
        print(f"gpuscope-render: error: {out}: cannot write: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
