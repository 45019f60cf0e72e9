"""``gpuscope-dashboard``: the fleet dashboard on one of three data sources.

    gpuscope-dashboard --demo                                  # simulated fleet, no setup
    gpuscope-dashboard --prometheus http://prometheus:9090
    gpuscope-dashboard --prometheus-sigv4 --prometheus \
        https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-ID  # Amazon Managed Prometheus
    gpuscope-dashboard --targets http://10.0.0.5:9463/metrics,gpu-b=http://10.0.0.6:9463/metrics

Every flag can also be set as ``GPUSCOPE_<FLAG>`` (``--prices`` -> ``GPUSCOPE_PRICES``); the
command line wins. A bad flag, value or price file ends in one ``gpuscope-dashboard: error:``
line and exit code 2. Binds to 127.0.0.1 unless told otherwise.

Credentials for Prometheus come from files (or, for the basic-auth password, the
``GPUSCOPE_PROMETHEUS_BASIC_AUTH_PASSWORD`` variable) or AWS's credential chain; never from
a flag's value, which anyone on the host can read in the process list.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpuscope.alerts.render import RenderError
from gpuscope.alerts.render import parse_duration as parse_prometheus_duration
from gpuscope.dashboard.data import DataSource, EmbeddedData, Target, parse_targets
from gpuscope.dashboard.data.http import (
    Auth,
    BasicAuth,
    BearerAuth,
    CredentialError,
    PromApi,
    SecretFile,
    SigV4Auth,
    TlsConfig,
    amp_region,
    reject_credentials_in_url,
    reject_query_in_url,
)
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import PriceError, PriceTable, load_prices
from gpuscope.dashboard.verdicts import Thresholds, registry
from gpuscope.dashboard.verdicts.page import Threshold, ThresholdKind
from gpuscope.exporter.flags import (
    ConfigError,
    Flag,
    StartupError,
    ascii_float,
    ascii_number,
    boolean,
    log_level,
    read_flags,
    run_main,
    seconds_between,
    split_listen,
    version,
)
from gpuscope.exporter.flags import build_parser as _build_parser

log = logging.getLogger("gpuscope.dashboard")

PROG = "gpuscope-dashboard"


@dataclass(frozen=True, slots=True)
class Config:
    prometheus: str | None
    targets: tuple[Target, ...] | None
    demo: bool
    listen_host: str
    listen_port: int
    prices: str | None
    refresh: float
    scrape_interval: float
    log_level: str
    basic_auth_file: str | None
    # Prometheus' auth and TLS (--prometheus only); the secrets themselves stay in files.
    prometheus_bearer_token_file: str | None = None
    prometheus_basic_auth_user: str | None = None
    prometheus_basic_auth_password_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_cert_file: str | None = None
    prometheus_key_file: str | None = None
    prometheus_server_name: str | None = None
    prometheus_sigv4: bool = False
    prometheus_sigv4_region: str | None = None
    #: From GPUSCOPE_PROMETHEUS_BASIC_AUTH_PASSWORD; kept out of repr() (logs, tracebacks).
    prometheus_basic_auth_password: str | None = field(default=None, repr=False)
    #: The verdicts' thresholds (the flags made from the registry's).
    thresholds: Thresholds = field(default_factory=Thresholds)
    print_rules: bool = False
    cluster_label: str = "cluster"


def parse_listen(value: str) -> tuple[str, int]:
    split = split_listen(value)
    if split is None or not split[0]:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:8050, got {value!r}")
    host, port = split
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    return host, port


def parse_url(value: str) -> str:
    reject_credentials_in_url(value.strip())  # first: the messages below repeat the value
    parts = urllib.parse.urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL such as http://prometheus:9090, got {value!r}")
    reject_query_in_url(value.strip())
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    return value.strip().rstrip("/")






def parse_server_name(value: str) -> str:
    name = value.strip()
    if not name or not re.fullmatch(r"[A-Za-z0-9.:_\[\]-]+", name):
        raise ValueError(f"expected a host name such as prometheus.example.com, got {value!r}")
    return name


def parse_label(value: str) -> str:
    name = value.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.startswith("__"):
        raise ValueError(f"expected a label name such as cluster, got {value!r}")
    return name


def parse_region(value: str) -> str:
    region = value.strip()
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]+", region):
        raise ValueError(f"expected an AWS region such as us-east-1, got {value!r}")
    return region


def parse_duration(value: str) -> float:
    """Seconds: a number of them (``600``) or a Prometheus duration (``90s``, ``30m``,
    ``1h30m``: the rule file's syntax, :func:`gpuscope.alerts.render.parse_duration`);
    positive."""
    text = value.strip()
    try:
        seconds = float(text) if text.isascii() and text.replace(".", "", 1).isdigit() \
            else parse_prometheus_duration(text)
    except (ValueError, RenderError):
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"expected a duration such as 600, 90s, 30m or 1h, got {value!r}")
    return seconds


def _number(value: str, ok: Callable[[float], bool], expected: str) -> float:
    """``value`` as a float that ``ok`` accepts (nan never is), else ValueError."""
    number = ascii_float(value)
    if number is None or number != number or not ok(number):
        raise ValueError(f"expected {expected}, got {value!r}")
    return number


def parse_ratio(value: str) -> float:
    return _number(value, lambda x: 0 <= x <= 1, "a ratio from 0 to 1")


def parse_factor(value: str) -> float:
    return _number(value, lambda x: 0 < x < float("inf"), "a positive number")


def parse_count(value: str) -> int:
    number = ascii_number(value, max_digits=9)
    if number is None or number < 1:
        raise ValueError(f"expected a whole number >= 1, got {value!r}")
    return number


def parse_names(value: str, choices: Sequence[str] = ()) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names or not all(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", n) for n in names):
        raise ValueError(f"expected comma-separated names such as power,thermal, got {value!r}")
    unknown = [n for n in names if choices and n not in choices]
    if unknown:
        raise ValueError(f"unknown {', '.join(map(repr, unknown))}: expected some of "
                         f"{', '.join(choices)}")
    return names


_PARSE: dict[ThresholdKind, Callable[[str], Any]] = {
    "ratio": parse_ratio, "factor": parse_factor, "seconds": parse_duration,
    "count": parse_count,
}


def _converter(spec: Threshold) -> Callable[[str], Any]:
    """A threshold flag's parser, by its kind; names among the threshold's own choices."""
    if spec.kind == "names":
        return partial(parse_names, choices=spec.choices)
    return _PARSE[spec.kind]


#: The verdicts' thresholds, one flag each, from the registry (``--idle-utilization``...).
THRESHOLD_FLAGS: tuple[Flag, ...] = tuple(
    Flag(spec.flag, _converter(spec), spec.text(getattr(Thresholds(), spec.field)), spec.help)
    for spec in registry.THRESHOLDS)

_FLAGS: tuple[Flag, ...] = (
    Flag("--prometheus", parse_url, None, "Prometheus-compatible HTTP API to query"),
    Flag("--targets", parse_targets, None,
          "exporters to scrape directly, comma-separated [NODE=]URL "
          "(node: NODE, else the node_name the exporter states, else the URL's host, "
          "or host:port when hosts repeat)"),
    Flag("--demo", boolean, "false", "run a simulated fleet in-process and show it",
          boolean=True),
    Flag("--listen", parse_listen, "127.0.0.1:8050", "HOST:PORT to serve the dashboard on"),
    Flag("--prices", str, None, "YAML of instance type -> on-demand $/hour (overrides the "
          "bundled table)"),
    Flag("--refresh", seconds_between(1.0, 86400.0), "30",
         "auto-refresh interval of the page in seconds, 1 to 86400 (demo: 10)"),
    Flag("--scrape-interval", seconds_between(0.1, 3600.0), "15",
         "embedded mode: seconds between scrapes of the targets, 0.1 to 3600 (demo: 5)"),
    Flag("--log-level", log_level, "info", "debug, info, warning or error"),
    Flag("--basic-auth-file", str, None, "require HTTP basic auth: file of user:HASH lines "
          "(make them with: python -m gpuscope.dashboard.auth hash USER)"),
    # Towards Prometheus (docs/dashboard.md#managed-prometheus).
    Flag("--prometheus-bearer-token-file", str, None,
          "send Authorization: Bearer with the token in FILE (re-read when it changes)"),
    Flag("--prometheus-basic-auth-user", str, None,
          "basic auth towards Prometheus as USER; the password from "
          "--prometheus-basic-auth-password-file or GPUSCOPE_PROMETHEUS_BASIC_AUTH_PASSWORD"),
    Flag("--prometheus-basic-auth-password-file", str, None,
          "file holding the basic-auth password (re-read when it changes)"),
    Flag("--prometheus-ca-file", str, None,
          "PEM CA bundle to verify Prometheus' certificate with (instead of the system's)"),
    Flag("--prometheus-cert-file", str, None,
          "PEM client certificate for Prometheus (with --prometheus-key-file)"),
    Flag("--prometheus-key-file", str, None, "PEM key of --prometheus-cert-file"),
    Flag("--prometheus-server-name", parse_server_name, None,
          "name Prometheus' certificate must carry, when not the URL's host"),
    Flag("--prometheus-sigv4", boolean, "false",
          "sign requests with AWS SigV4 (Amazon Managed Service for Prometheus), "
          "credentials from the AWS default chain (IRSA, Pod Identity, env, instance profile)",
          boolean=True),
    Flag("--prometheus-sigv4-region", parse_region, None,
          "AWS region to sign for (default: from the aps-workspaces.REGION URL, else "
          "AWS_REGION / AWS_DEFAULT_REGION / the AWS profile)"),
    Flag("--cluster-label", parse_label, "cluster",
          "--prometheus: the label under which the store keeps each series' cluster (an "
          "external label of Thanos, Mimir, Amazon Managed Prometheus, VictoriaMetrics); a "
          "node is then its cluster's (cluster/node). Absent: one cluster"),
    Flag("--print-rules", boolean, "false",
          "print the gpuscope-dashboard recording rules for these thresholds (a rule group "
          "for Prometheus or vmalert) and exit", boolean=True),
    *THRESHOLD_FLAGS,
)

#: Not a flag: a password on the command line is visible to every user of the host.
PASSWORD_ENV = "GPUSCOPE_PROMETHEUS_BASIC_AUTH_PASSWORD"


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(
        PROG,
        "GPU fleet dashboard: idle nodes and their cost, starved pods, stragglers.",
        "Every flag can also be set as GPUSCOPE_<FLAG>, e.g. "
        "GPUSCOPE_PROMETHEUS=http://prometheus:9090.",
        _FLAGS,
    )


def parse_config(argv: Sequence[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> Config:
    values, explicit = read_flags(build_parser(), _FLAGS, argv, environ)
    thresholds = Thresholds(**{spec.field: values.pop(spec.field)
                               for spec in registry.THRESHOLDS})
    if not thresholds.input_low < thresholds.input_high:
        raise ConfigError(f"--input-low ({thresholds.input_low:g}) must be below --input-high "
                          f"({thresholds.input_high:g})")
    if values["print_rules"]:
        return Config(prometheus=None, targets=None, demo=False, listen_host="127.0.0.1",
                      listen_port=0, prices=None, refresh=30.0, scrape_interval=15.0,
                      log_level=values["log_level"], basic_auth_file=None,
                      thresholds=thresholds, print_rules=True,
                      cluster_label=values["cluster_label"])
    modes = [name for name, on in (("--prometheus", values["prometheus"] is not None),
                                   ("--targets", values["targets"] is not None),
                                   ("--demo", values["demo"])) if on]
    if not modes:
        raise ConfigError("choose a data source: --prometheus URL, --targets URL,... or --demo")
    if len(modes) > 1:
        raise ConfigError(f"choose one data source, got {' and '.join(modes)}")
    if "cluster_label" in explicit and values["prometheus"] is None:
        # The exporters scraped directly carry no cluster label: one cluster.
        raise ConfigError("--cluster-label needs --prometheus URL (or --print-rules)")
    env = os.environ if environ is None else environ
    values["prometheus_basic_auth_password"] = _check_prometheus_access(values, env)
    if values["demo"]:
        if "refresh" not in explicit:
            values["refresh"] = 10.0
        if "scrape_interval" not in explicit:
            values["scrape_interval"] = 5.0
    host, port = values.pop("listen")
    return Config(listen_host=host, listen_port=port, thresholds=thresholds, **values)


def _check_prometheus_access(values: dict[str, Any], env: Mapping[str, str]) -> str | None:
    """Check the combination of Prometheus' auth and TLS flags (ConfigError, one line) and
    fill in the SigV4 region where the URL or the environment gives it. Returns the
    basic-auth password when it comes from the environment."""
    given = [f.flag for f in _FLAGS if f.flag.startswith("--prometheus-") and values[f.dest]]
    password = env.get(PASSWORD_ENV) or None
    url = values["prometheus"]
    if url is None:
        if given:
            raise ConfigError(f"{given[0]} needs --prometheus URL")
        return None
    ways = [flag for flag, on in (
        ("--prometheus-bearer-token-file", values["prometheus_bearer_token_file"]),
        ("--prometheus-basic-auth-user", values["prometheus_basic_auth_user"]),
        ("--prometheus-sigv4", values["prometheus_sigv4"])) if on]
    if len(ways) > 1:
        raise ConfigError(f"choose one way to authenticate to Prometheus, got "
                          f"{' and '.join(ways)}")
    user = values["prometheus_basic_auth_user"]
    password_file = values["prometheus_basic_auth_password_file"]
    if user is not None:
        if password_file is None and password is None:
            raise ConfigError(f"--prometheus-basic-auth-user needs a password: "
                              f"--prometheus-basic-auth-password-file FILE or {PASSWORD_ENV}")
        if password_file is not None and password is not None:
            raise ConfigError(f"give the basic-auth password once: "
                              f"--prometheus-basic-auth-password-file or {PASSWORD_ENV}")
        if ":" in user or not user.strip() or not user.isprintable():
            raise ConfigError(f"--prometheus-basic-auth-user: expected a user name without "
                              f"':', got {user!r}")
    elif password_file is not None:
        raise ConfigError("--prometheus-basic-auth-password-file needs "
                          "--prometheus-basic-auth-user")
    if (values["prometheus_cert_file"] is None) != (values["prometheus_key_file"] is None):
        raise ConfigError("--prometheus-cert-file and --prometheus-key-file go together")
    tls = [flag for flag in ("--prometheus-ca-file", "--prometheus-cert-file",
                             "--prometheus-server-name")
           if values[flag.removeprefix("--").replace("-", "_")] is not None]
    if tls and urllib.parse.urlsplit(url).scheme != "https":
        raise ConfigError(f"{tls[0]} needs an https:// --prometheus URL, got {url}")
    if values["prometheus_sigv4_region"] is not None and not values["prometheus_sigv4"]:
        raise ConfigError("--prometheus-sigv4-region needs --prometheus-sigv4")
    if values["prometheus_sigv4"] and values["prometheus_sigv4_region"] is None:
        # The workspace URL names its region; else the AWS environment (EKS's webhooks set
        # AWS_REGION); else botocore's profile, looked up at start-up.
        values["prometheus_sigv4_region"] = (
            amp_region(url) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None)
    return password if user is not None else None


def prometheus_client(cfg: Config) -> PromApi:
    """The HTTP client for ``--prometheus`` with its auth and TLS, credentials and files
    loaded now (StartupError, one line, when one cannot be)."""
    assert cfg.prometheus is not None
    auth: Auth | None = None
    prefix = ""
    if cfg.prometheus_bearer_token_file is not None:
        auth = BearerAuth(SecretFile(cfg.prometheus_bearer_token_file,
                                     "--prometheus-bearer-token-file"))
    elif cfg.prometheus_basic_auth_user is not None:
        password: str | SecretFile
        if cfg.prometheus_basic_auth_password_file is not None:
            password = SecretFile(cfg.prometheus_basic_auth_password_file,
                                  "--prometheus-basic-auth-password-file")
        else:
            password = cfg.prometheus_basic_auth_password or ""
        try:
            auth = BasicAuth(cfg.prometheus_basic_auth_user, password)
        except ValueError as exc:
            raise StartupError(f"{PASSWORD_ENV}: {exc}") from None
    elif cfg.prometheus_sigv4:
        prefix = "--prometheus-sigv4: "
        try:
            auth = SigV4Auth(cfg.prometheus_sigv4_region)
        except CredentialError as exc:
            raise StartupError(f"{prefix}{exc}") from None
    tls = None
    if any((cfg.prometheus_ca_file, cfg.prometheus_cert_file, cfg.prometheus_server_name)):
        tls = TlsConfig(cfg.prometheus_ca_file, cfg.prometheus_cert_file,
                        cfg.prometheus_key_file, cfg.prometheus_server_name,
                        names=("--prometheus-ca-file", "--prometheus-cert-file",
                               "--prometheus-key-file"))
    client = PromApi(cfg.prometheus, auth=auth, tls=tls, user_agent=f"{PROG}/{version()}")
    try:
        client.check_tls()
    except CredentialError as exc:
        raise StartupError(str(exc)) from None
    try:
        if auth is not None:
            auth.check()
    except CredentialError as exc:
        raise StartupError(f"{prefix}{exc}") from None
    if isinstance(auth, (BearerAuth, BasicAuth)) and not cfg.prometheus.startswith("https:"):
        log.warning("Prometheus credentials go over plain http to %s: use https, or a "
                    "network you trust", cfg.prometheus)
    if auth is not None or tls is not None:
        log.info("Prometheus auth: %s%s", auth.describe() if auth is not None else "none",
                 "; TLS: " + tls.describe() if tls is not None else "")
    return client


def run(cfg: Config, stop: threading.Event,
        ready: Callable[[int], None] | None = None) -> int:
    if cfg.print_rules:
        from gpuscope.dashboard.plan import rules_yaml

        print("groups:\n" + rules_yaml(cfg.thresholds, cfg.cluster_label), end="")
        return 0
    from gpuscope.dashboard.app import DashboardServer, create_app
    from gpuscope.dashboard.service import DashboardService

    auth = None
    if cfg.basic_auth_file is not None:
        from gpuscope.dashboard.auth import AuthFileError, load_credentials

        try:
            auth = load_credentials(cfg.basic_auth_file)
        except AuthFileError as exc:
            raise StartupError(f"--basic-auth-file {exc}") from None
    try:
        prices: PriceTable = load_prices(cfg.prices)
    except PriceError as exc:
        raise StartupError(f"--prices {exc}") from None

    cleanup: list[Callable[[], None]] = []
    source: DataSource
    if cfg.prometheus is not None:
        source = PrometheusData(cfg.prometheus, client=prometheus_client(cfg),
                                thresholds=cfg.thresholds, cluster_label=cfg.cluster_label,
                                prices=prices)
    else:
        targets = cfg.targets or ()
        if cfg.demo:
            from gpuscope.dashboard.demo import DemoFleet

            fleet = DemoFleet()
            cleanup.append(fleet.stop)
            targets = fleet.start()
        label = f"demo: {len(targets)} simulated nodes, scraped in-process" if cfg.demo else None
        notes = (("Demo: the simulated fleet comes with an hour of generated past, so verdicts "
                  "that need an hour of evidence (idle for 1h) show from the first page load.",)
                 if cfg.demo else ())
        # The store keeps what the registry's verdicts read besides the fleet page's series.
        embedded = EmbeddedData(targets, interval=cfg.scrape_interval, label=label,
                                notes=notes,
                                straggler_duration=cfg.thresholds.straggler_duration,
                                extra_metrics=registry.step_metrics())
        if cfg.demo:
            fleet.backfill(embedded, step=cfg.scrape_interval)
        embedded.start()
        source = embedded
    cleanup.insert(0, source.close)

    service = DashboardService(source, prices, thresholds=cfg.thresholds)
    service.keep_warm(cfg.refresh)
    cleanup.insert(0, service.close)
    app = create_app(service, refresh_seconds=cfg.refresh)
    if auth is not None:
        from gpuscope.dashboard.auth import install

        install(app.server, auth)
        log.info("basic auth on: %d user(s) from %s", len(auth.users), cfg.basic_auth_file)
    try:
        server = DashboardServer(app, cfg.listen_host, cfg.listen_port)
    except OSError as exc:
        for fn in cleanup:
            fn()
        raise StartupError(f"cannot listen on {cfg.listen_host}:{cfg.listen_port}: "
                           f"{exc.strerror or exc}") from None
    server.start()
    host = f"[{cfg.listen_host}]" if ":" in cfg.listen_host else cfg.listen_host
    print(f"{PROG}: {source.description}; open http://{host}:{server.port}/",
          file=sys.stderr, flush=True)
    if ready is not None:
        ready(server.port)
    stop.wait()
    log.info("shutting down")
    server.stop()
    for fn in cleanup:
        fn()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(PROG, parse_config, lambda cfg: cfg.log_level, run, argv)


if __name__ == "__main__":
    sys.exit(main())
