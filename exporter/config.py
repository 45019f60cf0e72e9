"""Command-line flags and their ``GPUSCOPE_*`` environment variables.

Every flag can also come from ``GPUSCOPE_<FLAG>`` (``--node-name`` → ``GPUSCOPE_NODE_NAME``); a
flag on the command line wins over the environment. Any bad value raises
:class:`ConfigError` with one line that names the flag or variable, and the CLI exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuscope.exporter.flags import (
    ConfigError,
    Flag,
    ascii_number,
    boolean,
    choice,
    log_level,
    positive_seconds,
    read_flags,
    seconds_between,
    split_listen,
    text,
)
from gpuscope.exporter.flags import (
    build_parser as _build_parser,
)

__all__ = ["Config", "ConfigError", "build_parser", "parse_config"]


@dataclass(frozen=True, slots=True)
class Config:
    listen_host: str
    listen_port: int
    interval: float
    source: str
    scenario: str | None
    node_name: str
    instance_type: str | None
    process_metrics: bool
    log_level: str
    kubelet_socket: str
    proc_root: str
    kubeconfig: str | None
    gpu_resources: tuple[str, ...]
    # CloudWatch (docs/cloudwatch.md)
    cloudwatch: bool
    cloudwatch_namespace: str
    cloudwatch_region: str | None
    cloudwatch_endpoint_url: str | None
    cloudwatch_interval: float
    cloudwatch_dry_run: bool
    cloudwatch_buffer: float
    cloudwatch_device_dimensions: str
    cluster_name: str | None
    instance_id: str | None
    # Cardinality caps (exporter/cardinality.py)
    max_process_series: int
    max_container_series: int
    # TLS for the endpoints (docs/security.md)
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_client_ca_file: str | None
    probe_listen: tuple[str, int] | None
    max_connections: int
    # True when node_name is only the hostname (no --node-name, no $NODE_NAME): a simulated
    # exporter then states its scenario's node instead (gpu_node_info{node_name}).
    node_name_is_hostname: bool = False


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (every address, IPv6 and IPv4: ``[::]:PORT``) or
    ``[V6]:PORT``."""
    split = split_listen(value)
    if split is None:
        raise ValueError(f"expected HOST:PORT (an IPv6 host in brackets: [::]:9463), got {value!r}")
    host, port = split
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    return host or "::", port






def cloudwatch_namespace(value: str) -> str:
    """A CloudWatch namespace: 1..255 printable ASCII characters, not ``AWS/…`` (reserved)."""
    if not 1 <= len(value) <= 255:
        raise ValueError(f"expected 1 to 255 characters, got {len(value)}")
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"expected printable ASCII, got {value!r}")
    if value.startswith("AWS/"):
        raise ValueError(f"namespaces starting with AWS/ are reserved for AWS, got {value!r}")
    return value


_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")


def aws_region(value: str) -> str:
    if not _REGION.fullmatch(value):
        raise ValueError(f"expected an AWS region like us-east-1, got {value!r}")
    return value


def endpoint_url(value: str) -> str:
    """An http(s) CloudWatch endpoint without ``user:password@``: botocore never sends such
    credentials (requests are SigV4-signed), and the URL is in every failed call's line."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.username is not None:  # first: the messages below repeat the value
        raise ValueError("the URL must not hold credentials (user:password@); AWS requests "
                         "are signed with the AWS credential chain")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    return value


def publish_interval(value: str) -> float:
    """Seconds, 1..3600: CloudWatch stores standard-resolution data per minute, and a
    longer interval would hold back every alarm."""
    seconds = positive_seconds(value)
    if not 1.0 <= seconds <= 3600.0:
        raise ValueError(f"expected 1 to 3600 seconds, got {value!r}")
    return seconds


def buffer_seconds(value: str) -> float:
    seconds = positive_seconds(value)
    if seconds > 86400.0:
        raise ValueError(f"expected at most 86400 seconds (one day), got {value!r}")
    return seconds


def label_text(value: str) -> str:
    """Text that becomes a label or dimension value: UTF-8. Bytes that are not decode to
    surrogates (argv, the environment) that no /metrics render can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"expected UTF-8 text, got {value!r}") from None
    return value


def dimension_value(value: str) -> str:
    """A CloudWatch dimension value: 1..1024 characters of UTF-8."""
    if not 1 <= len(value) <= 1024 or not value.strip():
        raise ValueError(f"expected 1 to 1024 characters, got {value!r}")
    return label_text(value)


_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


def instance_id(value: str) -> str:
    """An EC2 instance ID (``i-0123456789abcdef0``) or ``imds`` (ask instance metadata)."""
    if value != "imds" and not _INSTANCE_ID.fullmatch(value):
        raise ValueError(f"expected an instance ID like i-0123456789abcdef0 or imds, "
                         f"got {value!r}")
    return value


def _count(value: str, what: str, most: int) -> int:
    """A whole number of ``what``, 1..``most``."""
    number = ascii_number(value)
    if number is None:
        raise ValueError(f"expected a whole number of {what}, got {value!r}")
    if not 1 <= number <= most:
        raise ValueError(f"expected 1 to {most}, got {number}")
    return number


def series_cap(value: str) -> int:
    """A cap on label sets: an integer 1..1,000,000."""
    return _count(value, "series", 1_000_000)


def connection_cap(value: str) -> int:
    """A cap on open connections: an integer 1..100,000."""
    return _count(value, "connections", 100_000)


def names(value: str) -> tuple[str, ...]:
    """A comma-separated list, e.g. extended resource names ``example.com/gpu,acme/mig-*``."""
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    for item in items:
        if "/" not in item:
            raise ValueError(f"expected resource names like vendor.com/gpu, got {item!r}")
    return items


_FLAGS: tuple[Flag, ...] = (
    Flag("--listen", parse_listen, "[::]:9463",
          "HOST:PORT to serve /metrics, /healthz, /readyz ([::]: every IPv6 and IPv4 "
          "address; IPv4 alone where the kernel has no IPv6)"),
    Flag("--interval", seconds_between(0.1, 3600.0), "1",
         "sampling interval in seconds (0.1 to 3600)"),
    Flag("--source", choice("nvml", "simulated"), "nvml", "where samples come from"),
    Flag("--scenario", text, None, "YAML scenario for --source simulated (default: built-in)"),
    Flag("--node-name", label_text, None,
         "this node's name (default: $NODE_NAME, else the hostname)"),
    Flag("--instance-type", label_text, None, "instance type when node labels are unavailable"),
    Flag("--process-metrics", boolean, "false", "also export per-process series (cardinality!)",
          boolean=True),
    Flag("--kubelet-socket", text, "/var/lib/kubelet/pod-resources/kubelet.sock",
          "kubelet PodResources v1 socket (which container holds which GPU)"),
    Flag("--proc-root", text, "/proc", "host /proc (PID to container via cgroups)"),
    Flag("--kubeconfig", text, None,
          "kubeconfig for pod/node names (default: in-cluster config; neither: names off)"),
    Flag("--gpu-resources", names, "",
          "extra GPU resource names besides nvidia.com/gpu, nvidia.com/gpu.shared, "
          "nvidia.com/mig-* (comma-separated; a trailing * matches a prefix)"),
    Flag("--max-process-series", series_cap, "2000",
          "most per-process series (--process-metrics) per node; each GPU's biggest device "
          "memory holders are kept, the rest counted in gpu_exporter_series_dropped_total"),
    Flag("--max-container-series", series_cap, "2000",
          "most (container, device) rows of container_gpu_* per node; allocated rows first"),
    Flag("--log-level", log_level, "info", "log verbosity"),
    Flag("--cloudwatch", boolean, "false",
          "publish to CloudWatch (boto3 default credentials: IRSA, instance profile, env)",
          boolean=True),
    Flag("--cloudwatch-namespace", cloudwatch_namespace, "CWAgent", "CloudWatch namespace"),
    Flag("--cloudwatch-region", aws_region, None,
          "AWS region (default: AWS_REGION, else AWS_DEFAULT_REGION or the AWS profile)"),
    Flag("--cloudwatch-endpoint-url", endpoint_url, None,
          "CloudWatch endpoint (VPC endpoints, tests)"),
    Flag("--cloudwatch-interval", publish_interval, "60",
          "seconds aggregated into one datum per series (one flush per interval)"),
    Flag("--cloudwatch-dry-run", boolean, "false",
          "print the datums as JSON lines on stdout instead of sending them (no AWS call)",
          boolean=True),
    Flag("--cloudwatch-buffer", buffer_seconds, "1800",
          "seconds of data kept while CloudWatch is unreachable; older data is dropped"),
    Flag("--cloudwatch-device-dimensions", choice("agent", "extended", "both"), "both",
          "device dimension sets: agent (host,index,name,arch), extended (plus InstanceId, "
          "InstanceType, ClusterName), or both"),
    Flag("--cluster-name", dimension_value, None,
          "cluster name: CloudWatch's ClusterName dimension (pod and node rollups need it) "
          "and the cluster label of gpu_node_info"),
    Flag("--instance-id", instance_id, None,
          "EC2 instance ID for the InstanceId dimension, or imds to ask instance metadata"),
    Flag("--tls-cert-file", text, None,
          "PEM certificate (chain): serve every endpoint over TLS (with --tls-key-file)"),
    Flag("--tls-key-file", text, None, "PEM private key of --tls-cert-file"),
    Flag("--tls-client-ca-file", text, None,
          "PEM CA certificate(s): require client certificates signed by them"),
    Flag("--probe-listen", parse_listen, None,
          "HOST:PORT to also serve /healthz and /readyz, and nothing else, over plain HTTP "
          "(kubelet probes cannot present a client certificate)"),
    Flag("--max-connections", connection_cap, "64",
          "most connections open at once on each port (a thread each); a new one at the cap "
          "closes the one idle the longest, or is closed when none is idle"),
)


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(
        "gpuscope-exporter",
        "GPU metrics exporter: NVML (or a simulated fleet) to Prometheus and CloudWatch.",
        "Every flag can also be set as GPUSCOPE_<FLAG>, e.g. GPUSCOPE_INTERVAL=5.",
        _FLAGS,
    )


def parse_config(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
) -> Config:
    """Flags win over ``GPUSCOPE_*`` variables, which win over defaults."""
    env = os.environ if environ is None else environ
    values, _ = read_flags(build_parser(), _FLAGS, argv, env)

    host, port = values.pop("listen")
    if values["scenario"] is not None and values["source"] != "simulated":
        raise ConfigError("--scenario only applies to --source simulated")
    if values["cloudwatch_dry_run"] and not values["cloudwatch"]:
        raise ConfigError("--cloudwatch-dry-run only applies with --cloudwatch")
    if (values["tls_cert_file"] is None) != (values["tls_key_file"] is None):
        raise ConfigError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if values["tls_client_ca_file"] is not None and values["tls_cert_file"] is None:
        raise ConfigError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    if values["cloudwatch"] and values["cloudwatch_region"] is None and env.get("AWS_REGION"):
        # botocore reads AWS_DEFAULT_REGION (and the profile) but not AWS_REGION, the
        # variable every other AWS SDK reads first and the one documented here.
        try:
            values["cloudwatch_region"] = aws_region(env["AWS_REGION"])
        except ValueError as exc:
            raise ConfigError(f"AWS_REGION: {exc}") from None
    given = values.pop("node_name")
    if not given and env.get("NODE_NAME"):
        try:
            given = label_text(env["NODE_NAME"])
        except ValueError as exc:
            raise ConfigError(f"NODE_NAME: {exc}") from None
    return Config(listen_host=host, listen_port=port, node_name=given or hostname(),
                  node_name_is_hostname=not given, **values)
