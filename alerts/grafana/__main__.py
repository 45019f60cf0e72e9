"""``python -m gpuscope.alerts.grafana``: writes the dashboards and the price rules.

``--check`` writes nothing and exits 1 when a committed output is out of date (CI and
``tests/alerts/test_grafana.py``). ``--cluster-label NAME`` writes dashboards whose queries
read the cluster label ``NAME`` (the store's, as the rules rendered with ``python -m
gpuscope.alerts.render --cluster-label NAME`` read it), ``--output-dir DIR`` writes the
dashboards there instead of the committed folders. Bad input (an unreadable rule file or
price table, a rule the dashboards name that the rule file lacks, a cluster label the
renderer would refuse or that the dashboards' queries already use) ends in one
``gpuscope-grafana: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpuscope.alerts.grafana.dashboards import DASHBOARDS, with_cluster_label
from gpuscope.alerts.grafana.panels import Json
from gpuscope.alerts.grafana.promql import ScopeError, labels_named
from gpuscope.alerts.grafana.rules import GrafanaError, Rules, with_price_group
from gpuscope.alerts.render import (
    ALERTS_DIR,
    DEFAULT_CLUSTER_LABEL,
    RULES_FILE,
    RenderError,
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
            cluster_label: str = DEFAULT_CLUSTER_LABEL) -> dict[Path, str]:
    """Every generated file and its text. The rule file's price group is made first, and
    the dashboards read the rule file as it will be; their queries then read the cluster
    label ``cluster_label``. The rule file keeps ``cluster`` whatever ``cluster_label`` is:
    the renderer renames it there (``--cluster-label``)."""
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
    _check_cluster_label(data, boards, cluster_label)
    for name, board in boards.items():
        if cluster_label != DEFAULT_CLUSTER_LABEL:
            board = with_cluster_label(board, cluster_label)
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
    used: set[str] = set()
    for board in boards.values():
        for panel in board["panels"]:
            for inner in (panel, *panel.get("panels", [])):
                for target in inner.get("targets", []):
                    used |= labels_named(target["expr"])
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                used |= labels_named(variable["query"])
    if label != DEFAULT_CLUSTER_LABEL and label in used:
        raise GrafanaError(f"--cluster-label: {label!r} is already a label, metric or keyword "
                           "of the dashboards' queries")


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
        files = outputs(args.rules, args.prices, out_dirs, args.cluster_label)
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
