from __future__ import annotations

import pytest

from exporter.config import ConfigError, parse_config


def parse(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_config(argv, env or {}, hostname=lambda: "host-from-uname")


def test_defaults() -> None:
    cfg = parse([])
    assert (cfg.listen_host, cfg.listen_port) == ("0.0.0.0", 9400)
    assert cfg.interval == 1.0
    assert cfg.source == "nvml"
    assert cfg.node_name == "host-from-uname"
    assert cfg.process_metrics is False


def test_env_vars_fill_every_flag_and_flags_win() -> None:
    env = {
        "GPUSCOPE_LISTEN": "127.0.0.1:9999",
        "GPUSCOPE_INTERVAL": "2.5",
        "GPUSCOPE_SOURCE": "simulated",
        "GPUSCOPE_SCENARIO": "/tmp/s.yaml",
        "GPUSCOPE_NODE_NAME": "gpu-node-7",
        "GPUSCOPE_INSTANCE_TYPE": "p4d.24xlarge",
        "GPUSCOPE_PROCESS_METRICS": "true",
        "GPUSCOPE_LOG_LEVEL": "debug",
    }
    cfg = parse([], env)
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9999)
    assert cfg.interval == 2.5
    assert cfg.source == "simulated"
    assert cfg.scenario == "/tmp/s.yaml"
    assert cfg.node_name == "gpu-node-7"
    assert cfg.instance_type == "p4d.24xlarge"
    assert cfg.process_metrics is True
    assert cfg.log_level == "debug"
    cfg = parse(["--interval", "7", "--no-process-metrics"], env)
    assert cfg.interval == 7.0
    assert cfg.process_metrics is False


def test_node_name_falls_back_to_NODE_NAME_then_hostname() -> None:
    assert parse([], {"NODE_NAME": "from-downward-api"}).node_name == "from-downward-api"
    assert parse(["--node-name", "explicit"], {"NODE_NAME": "x"}).node_name == "explicit"


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--interval", "abc"], {}, "--interval: expected a number of seconds"),
        (["--interval", "-1"], {}, "--interval: expected a positive number"),
        (["--interval", "nan"], {}, "--interval: expected a positive number"),
        (["--listen", "9400"], {}, "--listen: expected HOST:PORT"),
        (["--listen", "0.0.0.0:70000"], {}, "--listen: port must be 0..65535"),
        (["--source", "dcgm"], {}, "--source: expected one of nvml, simulated"),
        ([], {"GPUSCOPE_INTERVAL": "soon"}, "GPUSCOPE_INTERVAL: expected a number"),
        ([], {"GPUSCOPE_PROCESS_METRICS": "maybe"}, "GPUSCOPE_PROCESS_METRICS: expected true"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--scenario", "x.yaml"], {}, "--scenario only applies to --source simulated"),
    ],
)
def test_bad_values_give_one_line(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(argv, env)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_ipv6_and_all_interfaces() -> None:
    assert parse(["--listen", "[::1]:9400"]).listen_host == "::1"
    assert parse(["--listen", ":9500"]).listen_host == "0.0.0.0"
