"""Grafana dashboards generated from the rule file (``python -m gpuscope.alerts.grafana``).

A build-time tool: neither the exporter nor the gpuscope dashboard imports it. Its
outputs are committed: ``alerts/generated/grafana/*.json`` (import them by hand), the same
files in ``deploy/components/grafana-dashboards/dashboards/`` (the kustomize component that
provisions them as ConfigMaps for Grafana's dashboard sidecar), and the ``gpuscope-grafana``
price group at the end of ``alerts/gpuscope-rules.yaml``. See docs/grafana.md.
"""
