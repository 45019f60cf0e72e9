"""The fleet page's plan of queries on a Prometheus-compatible store: the older verdicts'
PromQL forms and recording rules (:mod:`.rules`), their rounds of queries (:mod:`.queries`)
and the fleet page's data from the answers (:mod:`.fleet`). It sits above the verdicts (it
reads their thresholds and groups) and below the views; the stores under it
(``dashboard/data/``) import nothing from here or from the verdicts."""

from gpuscope.dashboard.plan.fleet import PrometheusData
from gpuscope.dashboard.plan.rules import RULES, recording_rules, rules_yaml

__all__ = ["RULES", "PrometheusData", "recording_rules", "rules_yaml"]
