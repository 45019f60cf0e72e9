"""gpuscope alerting: Prometheus rules (``gpuscope-rules.yaml``), their PrometheusRule rendering
(:mod:`alerts.render`), and CloudWatch alarms for the headline cases (:mod:`alerts.alarms`)."""
