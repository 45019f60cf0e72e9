"""gpuscope-dashboard's flags, environment variables and one-line errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscope.dashboard.cli import ConfigError, main, parse_config
from gpuscope.dashboard.data import Target
from tests.conftest import REPO


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
    (["--demo", "--refresh", "0"], {}, "--refresh: expected a positive number"),
    (["--demo"], {"GPUSCOPE_LISTEN": "nope"}, "GPUSCOPE_LISTEN: expected HOST:PORT"),
    ([], {"GPUSCOPE_DEMO": "maybe"}, "GPUSCOPE_DEMO: expected true or false"),
    (["--demo", "--bogus"], {}, "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_clear_line(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


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
