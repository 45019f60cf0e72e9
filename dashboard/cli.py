"""``gpuscope-dashboard``: the fleet dashboard on one of three data sources.

    gpuscope-dashboard --demo                                  # simulated fleet, no setup
    gpuscope-dashboard --prometheus http://prometheus:9090
    gpuscope-dashboard --targets http://10.0.0.5:9463/metrics,gpu-b=http://10.0.0.6:9463/metrics

Every flag can also be set as ``GPUSCOPE_<FLAG>`` (``--prices`` -> ``GPUSCOPE_PRICES``); the
command line wins. A bad flag, value or price file ends in one ``gpuscope-dashboard: error:``
line and exit code 2. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuscope.dashboard.data import DataSource, EmbeddedData, PrometheusData, Target, parse_targets
from gpuscope.dashboard.prices import PriceError, PriceTable, load_prices
from gpuscope.exporter.flags import (
    ConfigError,
    Flag,
    StartupError,
    boolean,
    log_level,
    positive_seconds,
    read_flags,
    run_main,
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


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    digits = port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
    if not sep or not digits or not host:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:8050, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    return host.strip("[]"), port


def parse_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL such as http://prometheus:9090, got {value!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    return value.strip().rstrip("/")








_FLAGS: tuple[Flag, ...] = (
    Flag("--prometheus", parse_url, None, "Prometheus-compatible HTTP API to query"),
    Flag("--targets", parse_targets, None,
          "exporters to scrape directly, comma-separated [NODE=]URL "
          "(node label: NODE, else the URL's host)"),
    Flag("--demo", boolean, "false", "run a simulated fleet in-process and show it",
          boolean=True),
    Flag("--listen", parse_listen, "127.0.0.1:8050", "HOST:PORT to serve the dashboard on"),
    Flag("--prices", str, None, "YAML of instance type -> on-demand $/hour (overrides the "
          "bundled table)"),
    Flag("--refresh", positive_seconds, "30", "auto-refresh interval of the page in seconds "
          "(demo: 10)"),
    Flag("--scrape-interval", positive_seconds, "15",
          "embedded mode: seconds between scrapes of the targets (demo: 5)"),
    Flag("--log-level", log_level, "info", "debug, info, warning or error"),
    Flag("--basic-auth-file", str, None, "require HTTP basic auth: file of user:HASH lines "
          "(make them with: python -m gpuscope.dashboard.auth hash USER)"),
)


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

    modes = [name for name, on in (("--prometheus", values["prometheus"] is not None),
                                   ("--targets", values["targets"] is not None),
                                   ("--demo", values["demo"])) if on]
    if not modes:
        raise ConfigError("choose a data source: --prometheus URL, --targets URL,... or --demo")
    if len(modes) > 1:
        raise ConfigError(f"choose one data source, got {' and '.join(modes)}")
    if values["demo"]:
        if "refresh" not in explicit:
            values["refresh"] = 10.0
        if "scrape_interval" not in explicit:
            values["scrape_interval"] = 5.0
    host, port = values.pop("listen")
    return Config(listen_host=host, listen_port=port, **values)


def run(cfg: Config, stop: threading.Event,
        ready: Callable[[int], None] | None = None) -> int:
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
        source = PrometheusData(cfg.prometheus)
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
        embedded = EmbeddedData(targets, interval=cfg.scrape_interval, label=label,
                                notes=notes)
        if cfg.demo:
            fleet.backfill(embedded, step=cfg.scrape_interval)
        embedded.start()
        source = embedded
    cleanup.insert(0, source.close)

    service = DashboardService(source, prices)
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
