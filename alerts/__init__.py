"""gpuscope alerting: Prometheus rules (``gpuscope-rules.yaml``), their PrometheusRule rendering
(:mod:`gpuscope.alerts.render`), and CloudWatch alarms for the headline cases
(:mod:`gpuscope.alerts.alarms`)."""
