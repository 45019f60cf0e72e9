"""``python -m gpuscope.alerts.grafana``: writes the dashboards and the price rules.

``--check`` writes nothing and exits 1 when a committed output is out of date (CI and
``tests/alerts/test_grafana.py``). Bad input (an unreadable rule file or price table, a
rule the dashboards name that the rule file lacks) ends in one
``gpuscope-grafana: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gpuscope.alerts.grafana.dashboards import DASHBOARDS
from gpuscope.alerts.grafana.promql import ScopeError
from gpuscope.alerts.grafana.rules import GrafanaError, Rules, with_price_group
from gpuscope.alerts.render import ALERTS_DIR, RULES_FILE, RenderError, parse_rules, read_rules_text
from gpuscope.dashboard.prices import PriceError, load_prices
from gpuscope.exporter.files import write_text_atomic

#: Where the dashboards are written: for import by hand, and for the kustomize component
#: (kustomize reads only files under the component's own folder, hence the copy).
JSON_DIR = ALERTS_DIR / "generated" / "grafana"
COMPONENT_DIR = ALERTS_DIR.parent / "deploy" / "components" / "grafana-dashboards" / "dashboards"


def dashboard_text(obj: object) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def outputs(rules_file: Path = RULES_FILE, prices_file: Path | None = None,
            out_dirs: Sequence[Path] = (JSON_DIR, COMPONENT_DIR)) -> dict[Path, str]:
    """Every generated file and its text. The rule file's price group is made first, and
    the dashboards read the rule file as it will be."""
    try:
        prices = load_prices(prices_file)
        text = read_rules_text(rules_file)
    except (PriceError, RenderError) as exc:
        raise GrafanaError(str(exc)) from None
    rules_text = with_price_group(text, prices)
    files = {rules_file: rules_text}
    tmp_rules = _parse_rules(rules_text, rules_file)
    for name, build in DASHBOARDS.items():
        body = dashboard_text(build(tmp_rules))
        for folder in out_dirs:
            files[folder / f"{name}.json"] = body
    return files


def _parse_rules(text: str, where: Path) -> Rules:
    try:
        return Rules(parse_rules(text, where))
    except RenderError as exc:
        raise GrafanaError(str(exc)) from None


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
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a generated file is not up to date")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        files = outputs(args.rules, args.prices)
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
