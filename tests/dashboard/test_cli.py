"""gpuscope-dashboard's flags, environment variables and one-line errors."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuscope.dashboard import cli
from gpuscope.dashboard.cli import ConfigError, main, parse_config
from gpuscope.dashboard.data import EmbeddedData, Target
from tests.conftest import REPO, free_port, wait_for
from tests.dashboard.test_http import CheckServer, basic_check, make_pki


def test_defaults_bind_to_loopback() -> None:
    cfg = parse_config(["--prometheus", "http://prom:9090/"], environ={})
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 8050)
    assert cfg.prometheus == "http://prom:9090"
    assert cfg.refresh == 30.0 and cfg.prices is None


def test_demo_refreshes_faster_unless_told() -> None:
    assert parse_config(["--demo"], environ={}).refresh == 10.0
    assert parse_config(["--demo", "--refresh", "60"], environ={}).refresh == 60.0


def test_targets_flag() -> None:
    cfg = parse_config(["--targets", "a=http://10.0.0.5:9463/metrics,http://h:9463"], environ={})
    assert cfg.targets == (Target("http://10.0.0.5:9463/metrics", "a"),
                           Target("http://h:9463/metrics", "h", named=False))


def test_environment_variables_and_flag_precedence() -> None:
    env = {"GPUSCOPE_PROMETHEUS": "http://prom:9090", "GPUSCOPE_LISTEN": "0.0.0.0:9000",
           "GPUSCOPE_PRICES": "/etc/prices.yaml"}
    cfg = parse_config([], environ=env)
    assert cfg.prometheus == "http://prom:9090"
    assert (cfg.listen_host, cfg.listen_port) == ("0.0.0.0", 9000)
    assert cfg.prices == "/etc/prices.yaml"
    assert parse_config(["--listen", "127.0.0.1:1"], environ=env).listen_port == 1
    assert parse_config([], environ={"GPUSCOPE_DEMO": "true"}).demo


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {}, "choose a data source"),
    (["--demo", "--prometheus", "http://p:9090"], {}, "choose one data source"),
    (["--prometheus", "prom:9090"], {}, "--prometheus: expected an http(s) URL"),
    (["--targets", "10.0.0.5:9463"], {}, "--targets: expected an http(s) URL"),
    (["--demo", "--listen", "8050"], {}, "--listen: expected HOST:PORT"),
    # A bracket without its pair was dropped: "[::1:8050" listened on [::1]:8050.
    (["--demo", "--listen", "[::1:8050"], {}, "--listen: expected HOST:PORT"),
    (["--demo", "--listen", "::1]:8050"], {}, "--listen: expected HOST:PORT"),
    (["--demo", "--listen", "::8050"], {}, "--listen: expected HOST:PORT"),
    (["--demo", "--listen", "127.0.0.1:\u0668\u0660\u0665\u0660"], {},
     "--listen: expected HOST:PORT"),
    (["--demo", "--refresh", "0"], {}, "--refresh: expected a positive number"),
    # float() reads other scripts' digits: Arabic-Indic "0.5" was 0.5.
    (["--demo", "--idle-utilization", "\u0660.\u0665"], {}, "--idle-utilization: expected"),
    (["--demo", "--refresh", "1e308"], {}, "--refresh: expected 1 to 86400 seconds"),
    (["--demo", "--scrape-interval", "1e10"], {},
     "--scrape-interval: expected 0.1 to 3600 seconds"),
    (["--demo"], {"GPUSCOPE_LISTEN": "nope"}, "GPUSCOPE_LISTEN: expected HOST:PORT"),
    ([], {"GPUSCOPE_DEMO": "maybe"}, "GPUSCOPE_DEMO: expected true or false"),
    (["--demo", "--bogus"], {}, "unrecognized arguments: --bogus"),
    (["--demo", "--idle-utilization", "5%"], {}, "--idle-utilization: expected a ratio"),
    (["--demo", "--idle-utilization", "1.5"], {}, "--idle-utilization: expected a ratio"),
    (["--demo", "--spin-duration", "soon"], {}, "--spin-duration: expected a duration"),
    (["--demo", "--spin-duration", "0m"], {}, "--spin-duration: expected a duration"),
    (["--demo", "--share-factor", "-1"], {}, "--share-factor: expected a positive number"),
    (["--demo", "--input-min-samples", "2.5"], {}, "--input-min-samples: expected a whole"),
    (["--demo", "--throttle-reasons", "power;thermal"], {}, "--throttle-reasons: expected"),
    # A reason no exporter writes would never match: a typo is an error.
    (["--demo", "--throttle-reasons", "power,thermall"], {},
     "--throttle-reasons: unknown 'thermall': expected some of power, thermal"),
    (["--demo", "--input-low", "0.6"], {}, "--input-low (0.6) must be below --input-high"),
    (["--demo"], {"GPUSCOPE_IDLE_DURATION": "1 hour"}, "GPUSCOPE_IDLE_DURATION: expected"),
    (["--demo", "--cluster-label", "__name__"], {}, "--cluster-label: expected a label name"),
    (["--demo", "--cluster-label", "k8s-cluster"], {}, "--cluster-label: expected a label"),
])
def test_bad_input_is_one_clear_line(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_the_verdicts_thresholds_are_flags() -> None:
    """One flag per threshold the verdict modules declare (the registry's), with their
    defaults; durations in seconds or with a unit; the environment as for every flag."""
    from gpuscope.dashboard.verdicts import Thresholds

    assert parse_config(["--demo"], environ={}).thresholds == Thresholds()
    cfg = parse_config(["--demo", "--idle-utilization", "0.1", "--spin-duration", "45m",
                        "--throttle-reasons", "power,thermal", "--input-min-samples", "20",
                        "--slow-factor", "1.5"],
                       environ={"GPUSCOPE_ALLOCATED_IDLE_DURATION": "1h",
                                "GPUSCOPE_IDLE_UTILIZATION": "0.2"})
    assert cfg.thresholds == Thresholds(
        idle_utilization=0.1, spin_duration=2700.0, throttle_reasons=("power", "thermal"),
        input_min_samples=20, slow_factor=1.5, allocated_idle_duration=3600.0)


def test_print_rules_prints_the_rules_for_the_thresholds_and_promtool_takes_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--print-rules`` needs no data source: the gpuscope-dashboard group for the flags'
    thresholds, its version series labelled with them (the page reads only rules made for
    its own), a rule file promtool accepts."""
    from gpuscope.dashboard.verdicts import Thresholds
    from tests.stores import binary

    assert main(["--print-rules", "--idle-utilization", "0.1"]) == 0
    text = capsys.readouterr().out
    key = Thresholds(idle_utilization=0.1).key
    assert text.startswith("groups:\n  - name: gpuscope-dashboard\n")
    assert f'"thresholds", "{key}"' in text and Thresholds().key not in text
    assert "< 0.1" in text and "< 0.05" not in text.split("held_idle")[0]
    # Each node its cluster's, under the label the page is told.
    assert "max by (cluster, node, gpu, uuid)" in text
    assert main(["--print-rules", "--cluster-label", "k8s_cluster"]) == 0
    renamed = capsys.readouterr().out
    assert "max by (k8s_cluster, node, gpu, uuid)" in renamed and "(cluster," not in renamed
    assert '"cluster_label", "k8s_cluster"' in renamed
    assert parse_config(["--prometheus", "http://p:9090", "--cluster-label", "k8s_cluster"],
                        environ={}).cluster_label == "k8s_cluster"
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    check = subprocess.run([binary("promtool"), "check", "rules", str(rules)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_main_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--prometheus", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuscope-dashboard: error: --prometheus:") and err.count("\n") == 1
    bad = tmp_path / "prices.yaml"
    bad.write_text("p5.48xlarge: free\n")
    assert main(["--prometheus", "http://127.0.0.1:1", "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuscope-dashboard: error: --prices ") and err.count("\n") == 1
    assert "p5.48xlarge: expected a number" in err


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "gpuscope.dashboard", "--prometheus", "http://127.0.0.1:1",
             "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuscope-dashboard: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


# -- Prometheus behind auth and TLS (docs/dashboard.md#managed-prometheus) ------------------
P = ["--prometheus", "https://prom.example.com"]
PW_ENV = "GPUSCOPE_PROMETHEUS_BASIC_AUTH_PASSWORD"


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--demo", "--prometheus-ca-file", "ca.pem"], {},
     "--prometheus-ca-file needs --prometheus URL"),
    (["--targets", "http://h:9463", "--prometheus-sigv4"], {},
     "--prometheus-sigv4 needs --prometheus URL"),
    # Was ignored: the exporters scraped directly carry no cluster label.
    (["--targets", "http://h:9463", "--cluster-label", "k8s_cluster"], {},
     "--cluster-label needs --prometheus URL (or --print-rules)"),
    (["--demo"], {"GPUSCOPE_CLUSTER_LABEL": "k8s_cluster"}, "--cluster-label needs --prometheus"),
    ([*P, "--prometheus-bearer-token-file", "t", "--prometheus-sigv4"], {},
     "choose one way to authenticate to Prometheus, got --prometheus-bearer-token-file and "
     "--prometheus-sigv4"),
    ([*P, "--prometheus-basic-auth-user", "u", "--prometheus-bearer-token-file", "t"], {},
     "choose one way to authenticate to Prometheus"),
    ([*P, "--prometheus-basic-auth-user", "u"], {},
     f"--prometheus-basic-auth-user needs a password: --prometheus-basic-auth-password-file "
     f"FILE or {PW_ENV}"),
    ([*P, "--prometheus-basic-auth-password-file", "pw"], {},
     "--prometheus-basic-auth-password-file needs --prometheus-basic-auth-user"),
    ([*P, "--prometheus-basic-auth-user", "u", "--prometheus-basic-auth-password-file", "pw"],
     {PW_ENV: "x"}, "give the basic-auth password once"),
    ([*P, "--prometheus-basic-auth-user", "a:b"], {PW_ENV: "x"},
     "--prometheus-basic-auth-user: expected a user name without ':'"),
    ([*P, "--prometheus-cert-file", "c.pem"], {},
     "--prometheus-cert-file and --prometheus-key-file go together"),
    (["--prometheus", "http://prom:9090", "--prometheus-ca-file", "ca.pem"], {},
     "--prometheus-ca-file needs an https:// --prometheus URL, got http://prom:9090"),
    ([*P, "--prometheus-sigv4-region", "us-east-1"], {},
     "--prometheus-sigv4-region needs --prometheus-sigv4"),
    ([*P, "--prometheus-sigv4", "--prometheus-sigv4-region", "US East"], {},
     "--prometheus-sigv4-region: expected an AWS region such as us-east-1"),
    ([*P], {"GPUSCOPE_PROMETHEUS_SIGV4": "maybe"},
     "GPUSCOPE_PROMETHEUS_SIGV4: expected true or false"),
    ([*P, "--prometheus-server-name", "a b"], {}, "--prometheus-server-name: expected a host"),
])
def test_bad_prometheus_auth_combinations_are_one_line(argv: list[str], env: dict[str, str],
                                                       message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, environ=env)
    assert str(info.value).startswith(message) or message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_url_with_credentials_is_refused_without_repeating_them() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(["--prometheus", "https://admin:hunter2@prom:bad/"], environ={})
    assert str(info.value).startswith("--prometheus: the URL must not hold credentials")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["http://h:9090?x=1#frag", "http://h:9090/?x=1",
                                 "http://h:9090#frag", "http://h/prometheus?", "http://h:9090#"])
def test_a_prometheus_url_with_a_query_or_fragment_is_one_line_and_exit_2(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API paths are put after --prometheus (``?x=1/api/v1/query``): a query or a
    fragment is refused at start, named by its flag; a path prefix is not."""
    assert main(["--prometheus", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("gpuscope-dashboard: error: --prometheus: expected a URL without a "
                          "query or fragment"), err
    with pytest.raises(ConfigError, match=r"^GPUSCOPE_PROMETHEUS: expected a URL without"):
        parse_config([], environ={"GPUSCOPE_PROMETHEUS": url})
    prefix = parse_config(["--prometheus", "http://h/prometheus/"], environ={})
    assert prefix.prometheus == "http://h/prometheus"


def test_sigv4_region_from_flag_url_or_environment() -> None:
    amp = "https://aps-workspaces.eu-central-1.amazonaws.com/workspaces/ws-0a1b2c"
    sigv4 = ["--prometheus-sigv4"]
    assert parse_config(["--prometheus", amp, *sigv4], environ={
        "AWS_REGION": "us-east-1"}).prometheus_sigv4_region == "eu-central-1"
    assert parse_config([*P, *sigv4], environ={"AWS_REGION": "us-east-2"}
                        ).prometheus_sigv4_region == "us-east-2"
    assert parse_config([*P, *sigv4], environ={"AWS_DEFAULT_REGION": "sa-east-1"}
                        ).prometheus_sigv4_region == "sa-east-1"
    assert parse_config([*P, *sigv4], environ={}).prometheus_sigv4_region is None  # profile
    assert parse_config(["--prometheus", amp, *sigv4, "--prometheus-sigv4-region",
                         "us-gov-west-1"], environ={}).prometheus_sigv4_region == "us-gov-west-1"
    cfg = parse_config([], environ={"GPUSCOPE_PROMETHEUS": amp, "GPUSCOPE_PROMETHEUS_SIGV4": "1"})
    assert cfg.prometheus_sigv4 and cfg.prometheus_sigv4_region == "eu-central-1"


def test_basic_auth_password_from_the_environment_stays_out_of_repr() -> None:
    cfg = parse_config([*P, "--prometheus-basic-auth-user", "grafana"],
                       environ={PW_ENV: "hunter2"})
    assert cfg.prometheus_basic_auth_password == "hunter2"
    assert "hunter2" not in repr(cfg)
    # Without a user the variable is not used (and not kept).
    assert parse_config(P, environ={PW_ENV: "x"}).prometheus_basic_auth_password is None


def test_unusable_credentials_stop_the_start_with_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "token"
    assert main([*P, "--prometheus-bearer-token-file", str(missing)]) == 2
    assert capsys.readouterr().err == (f"gpuscope-dashboard: error: "
                                       f"--prometheus-bearer-token-file {missing}: "
                                       f"No such file or directory\n")
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello\n")
    assert main([*P, "--prometheus-ca-file", str(not_pem)]) == 2
    assert capsys.readouterr().err == (f"gpuscope-dashboard: error: --prometheus-ca-file "
                                       f"{not_pem}: no PEM certificate in it\n")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main([*P, "--prometheus-sigv4", "--prometheus-sigv4-region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuscope-dashboard: error: --prometheus-sigv4: no AWS credentials "
                          "found") and err.count("\n") == 1


@pytest.fixture
def basic_auth_server(tmp_path: Path) -> Iterator[tuple[CheckServer, Path]]:
    """(an HTTPS Prometheus API wanting basic auth grafana:pa55-from-env, its CA file)"""
    pki = make_pki(tmp_path)
    server = CheckServer(basic_check("grafana", "pa55-from-env"), tls=pki.server)
    yield server, pki.ca
    server.close()


def test_dashboard_queries_prometheus_over_tls_with_basic_auth(
        tmp_path: Path, basic_auth_server: tuple[CheckServer, Path]) -> None:
    """The real command: HTTPS with the test CA, basic auth with the password from the
    environment; the password is in neither the process's command line nor its log."""
    server, ca = basic_auth_server
    port = free_port()
    log = tmp_path / "dashboard.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    env[PW_ENV] = "pa55-from-env"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscope.dashboard", "--listen", f"127.0.0.1:{port}",
             "--prometheus", server.url, "--prometheus-ca-file", str(ca),
             "--prometheus-basic-auth-user", "grafana", "--log-level", "debug"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            # The default view is kept warm from the start: its queries arrive unprompted.
            wait_for(lambda: len(server.seen) >= 6 or proc.poll() is not None, 60,
                     "the dashboard's first queries")
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        finally:
            proc.terminate()
            proc.wait(15)
    expected = "Basic " + base64.b64encode(b"grafana:pa55-from-env").decode()
    assert set(server.seen) == {(expected, 200)}
    assert b"pa55" not in cmdline
    text = log.read_text()
    assert "Prometheus auth: basic auth as 'grafana', password from the environment; TLS: CA" \
        in text
    assert "pa55" not in text and expected.split()[1] not in text


def test_an_ipv6_listen_address_is_taken_without_its_brackets() -> None:
    cfg = parse_config(["--demo", "--listen", "[::1]:8050"], environ={})
    assert (cfg.listen_host, cfg.listen_port) == ("::1", 8050)


def test_the_embedded_store_reads_the_evidence_over_the_straggler_duration_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stragglers' evidence covers the last ``--straggler-duration`` (the page says so,
    and the Prometheus store reads it so): the embedded store was made with the default
    10 minutes whatever the flag, so with ``--straggler-duration 30m`` its rows said
    "(last 30m)" over 10 minutes of evidence."""
    made: list[EmbeddedData] = []

    class Recorded(EmbeddedData):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(cli, "EmbeddedData", Recorded)
    cfg = parse_config(["--targets", "http://127.0.0.1:1/metrics", "--listen", "127.0.0.1:0",
                        "--straggler-duration", "30m"], environ={})
    stop = threading.Event()
    stop.set()
    assert cli.run(cfg, stop) == 0
    assert [m.straggler_duration for m in made] == [1800.0]
