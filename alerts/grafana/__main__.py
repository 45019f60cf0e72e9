"""``python -m gpuscope.alerts.grafana``: writes the dashboards and the price rules.

``--check`` writes nothing and exits 1 when a committed output is out of date (CI and
``tests/alerts/test_grafana.py``). ``--cluster-label NAME`` writes dashboards whose queries
read the cluster label ``NAME`` (the store's, as the rules rendered with ``python -m
gpuscope.alerts.render --cluster-label NAME`` read it), ``--replica-labels A,B`` dashboards
whose queries read each series once where a store holds a copy per HA replica, told apart
by those labels (the recorded series too: both replicas evaluate the rules), ``--output-dir
DIR`` writes the dashboards there instead of the committed folders. Bad input (an
unreadable rule file or price table, a rule the dashboards name that the rule file lacks, a
cluster or replica label the renderer would refuse or that the dashboards' queries already
use) ends in one ``gpuscope-grafana: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpuscope.alerts.grafana.dashboards import (
    DASHBOARDS,
    with_cluster_label,
    with_replica_labels,
)
from gpuscope.alerts.grafana.panels import Json
from gpuscope.alerts.grafana.promql import ScopeError, labels_named
from gpuscope.alerts.grafana.rules import GrafanaError, Rules, with_price_group
from gpuscope.alerts.render import (
    ALERTS_DIR,
    DEFAULT_CLUSTER_LABEL,
    DEFAULT_REPLICA_LABELS,
    RULES_FILE,
    RenderError,
    label_list,
    parse_rules,
    read_rules_text,
    relabel_rules,
)
from gpuscope.dashboard.prices import PriceError, load_prices
from gpuscope.exporter.files import write_text_atomic

#: Where the dashboards are written: for import by hand, and for the kustomize component
#: (kustomize reads only files under the component's own folder, hence the copy).
JSON_DIR = ALERTS_DIR / "generated" / "grafana"
COMPONENT_DIR = ALERTS_DIR.parent / "deploy" / "components" / "grafana-dashboards" / "dashboards"


def dashboard_text(obj: object) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def outputs(rules_file: Path = RULES_FILE, prices_file: Path | None = None,
            out_dirs: Sequence[Path] = (JSON_DIR, COMPONENT_DIR),
            cluster_label: str = DEFAULT_CLUSTER_LABEL,
            replica_labels: Sequence[str] = ()) -> dict[Path, str]:
    """Every generated file and its text. The rule file's price group is made first, and
    the dashboards read the rule file as it will be; their queries then read the cluster
    label ``cluster_label``, and each series once over the HA replica labels
    ``replica_labels`` (none: as the builders write them). The rule file keeps ``cluster``
    whatever ``cluster_label`` is: the renderer renames it there (``--cluster-label``)."""
    try:
        prices = load_prices(prices_file)
        text = read_rules_text(rules_file)
    except (PriceError, RenderError) as exc:
        raise GrafanaError(str(exc)) from None
    rules_text = with_price_group(text, prices)
    files = {rules_file: rules_text}
    data = _parse_rules(rules_text, rules_file)
    rules = Rules(data)
    boards = {name: build(rules) for name, build in DASHBOARDS.items()}
    replicas = tuple(replica_labels)
    _check_cluster_label(data, boards, cluster_label)
    for name, board in boards.items():
        if cluster_label != DEFAULT_CLUSTER_LABEL:
            board = with_cluster_label(board, cluster_label)
        boards[name] = board
    _check_replica_labels(data, boards, cluster_label, replicas)
    for name, board in boards.items():
        if replicas:
            board = with_replica_labels(board, replicas)
        body = dashboard_text(board)
        for folder in out_dirs:
            files[folder / f"{name}.json"] = body
    return files


def _parse_rules(text: str, where: Path) -> dict[str, Any]:
    try:
        return parse_rules(text, where)
    except RenderError as exc:
        raise GrafanaError(str(exc)) from None


def _check_cluster_label(rules: dict[str, Any], boards: dict[str, Json], label: str) -> None:
    """``GrafanaError`` for a cluster label the renderer refuses (not a label name, reserved,
    a name the rules use, a replica label: :func:`relabel_rules`, its messages), or a name
    the dashboards' queries already read or make (``named``, ``cluster_node``, a label of
    ``label_replace``), which the renamed label would be mixed up with."""
    try:
        relabel_rules(rules, label)
    except RenderError as exc:
        raise GrafanaError(str(exc)) from None
    if label != DEFAULT_CLUSTER_LABEL and label in _names(boards):
        raise GrafanaError(f"--cluster-label: {label!r} is already a label, metric or keyword "
                           "of the dashboards' queries")


def _check_replica_labels(rules: dict[str, Any], boards: dict[str, Json], cluster_label: str,
                          labels: tuple[str, ...]) -> None:
    """``GrafanaError`` for replica labels the renderer refuses (``--replica-labels``: not
    label names, one named twice, the cluster label, a name the rules use), or a name the
    dashboards' queries (``boards``, their cluster label renamed) read or make other than the
    rules' own replica labels (``max without (prometheus_replica, __replica__, replica)``):
    a label that tells series apart would be folded into one."""
    if not labels:
        return
    try:
        relabel_rules(rules, cluster_label, labels)
    except RenderError as exc:
        raise GrafanaError(str(exc)) from None
    taken = [n for n in labels if n in _names(boards) - set(DEFAULT_REPLICA_LABELS)]
    if taken:
        raise GrafanaError(f"--replica-labels: {taken[0]!r} is already a label, metric or "
                           "keyword of the dashboards' queries")


def _names(boards: dict[str, Json]) -> set[str]:
    """Every name the dashboards' panel and variable queries read or make."""
    used: set[str] = set()
    for board in boards.values():
        for panel in board["panels"]:
            for inner in (panel, *panel.get("panels", [])):
                for target in inner.get("targets", []):
                    used |= labels_named(target["expr"])
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                used |= labels_named(variable["query"])
    return used


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise GrafanaError(message)


def _parser() -> _Parser:
    p = _Parser(prog="gpuscope-grafana", description=(
        "Write gpuscope's Grafana dashboards and the price rules from the rule file and the "
        "price table."))
    p.add_argument("--rules", type=Path, default=RULES_FILE, help="rule file (its "
                   "gpuscope-grafana group is rewritten)")
    p.add_argument("--prices", type=Path, default=None, help="price file whose entries win "
                   "over the bundled table (the gpuscope dashboard's --prices format)")
    p.add_argument("--cluster-label", default=DEFAULT_CLUSTER_LABEL, metavar="NAME",
                   help="the label that names a node's cluster in your store, as given to "
                        "python -m gpuscope.alerts.render (default: %(default)s)")
    p.add_argument("--replica-labels", type=label_list, default=(), metavar="A,B,...",
                   help="HA replica labels of a store that keeps each replica's copy of a "
                        "series, raw and recorded: every query counts the copies once "
                        "(default: none)")
    p.add_argument("--output-dir", type=Path, default=None, metavar="DIR",
                   help="write the dashboards to DIR (default: alerts/generated/grafana/ "
                        "and the kustomize component's dashboards/)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a generated file is not up to date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        out_dirs = (JSON_DIR, COMPONENT_DIR) if args.output_dir is None else (args.output_dir,)
        files = outputs(args.rules, args.prices, out_dirs, args.cluster_label,
                        args.replica_labels)
    except (GrafanaError, ScopeError) as exc:
        print(f"gpuscope-grafana: error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for path, text in files.items():
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current == text:
            continue
        if args.check:
            stale.append(path)
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)  # a failed write leaves the rule file whole
        except OSError as exc:
            print(f"gpuscope-grafana: error: {path}: cannot write: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    if stale:
        for path in stale:
            print(f"gpuscope-grafana: {path} is out of date: run python -m "
                  "gpuscope.alerts.grafana (then python -m gpuscope.alerts.render)",
                  file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
