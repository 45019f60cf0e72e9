"""Structural schemas for the Prometheus Operator kinds gpuscope ships (monitoring.coreos.com/v1).

kubernetes-validate knows only built-in kinds, and no offline validator for the operator's
CRDs is available here, so this is a hand-written subset of the CRDs' openAPIV3Schema: the
fields gpuscope uses plus the common ones around them, with the CRDs' types, enums and
patterns, and ``additionalProperties: false`` wherever the CRD is a closed object -- so a
misspelt field (``honourLabels``) or a wrong type fails here as it would fail the API server.
Rule semantics the schema cannot express (exactly one of ``record``/``alert``; what each
relabel action allows) are checked in the tests; rule expressions go through ``promtool``.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

# monitoring.coreos.com/v1 Duration.
DURATION: Schema = {
    "type": "string",
    "pattern": (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                r"(([0-9]+)s)?(([0-9]+)ms)?)$"),
}
LABEL_NAME: Schema = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
DNS_SUBDOMAIN: Schema = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}

METADATA: Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": DNS_SUBDOMAIN,
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

LABEL_SELECTOR: Schema = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}

NAMESPACE_SELECTOR: Schema = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}

_ACTIONS = [
    "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
    "lowercase", "uppercase", "keepequal", "dropequal",
]
RELABEL_ACTIONS = [*_ACTIONS, "Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop",
                   "LabelKeep", "Lowercase", "Uppercase", "KeepEqual", "DropEqual"]

RELABEL_CONFIG: Schema = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": RELABEL_ACTIONS},
        "modulus": {"type": "integer", "minimum": 0},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": LABEL_NAME},
        "targetLabel": {"type": "string"},
    },
}

_ENDPOINT_COMMON: dict[str, Schema] = {
    "path": {"type": "string"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "params": {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "string"}},
    },
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "trackTimestampsStaleness": {"type": "boolean"},
    "followRedirects": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"},
    "filterRunning": {"type": "boolean"},
    "proxyUrl": {"type": "string"},
    "relabelings": {"type": "array", "items": RELABEL_CONFIG},
    "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG},
}

SERVICE_MONITOR: Schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            **_ENDPOINT_COMMON,
                        },
                    },
                },
            },
        },
    },
}

POD_MONITOR: Schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podMetricsEndpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
                            "targetPort": {"type": ["integer", "string"]},
                            **_ENDPOINT_COMMON,
                        },
                    },
                },
            },
        },
    },
}

PROMETHEUS_RULE: Schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": DURATION,
                            "query_offset": DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "labels": STRING_MAP,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"type": ["integer", "string"]},
                                        "for": DURATION,
                                        "keep_firing_for": {"type": "string", "minLength": 1},
                                        "labels": STRING_MAP,
                                        "annotations": STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

SCHEMAS: dict[str, Schema] = {
    "ServiceMonitor": SERVICE_MONITOR,
    "PodMonitor": POD_MONITOR,
    "PrometheusRule": PROMETHEUS_RULE,
}
