from __future__ import annotations

import pytest

from gpuscope.exporter.config import ConfigError, parse_config


def parse(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_config(argv, env or {}, hostname=lambda: "host-from-uname")


def test_defaults() -> None:
    cfg = parse([])
    assert (cfg.listen_host, cfg.listen_port) == ("::", 9463)
    assert cfg.interval == 1.0
    assert cfg.source == "nvml"
    assert cfg.node_name == "host-from-uname"
    assert cfg.process_metrics is False
    assert cfg.cloudwatch is False
    assert cfg.cloudwatch_namespace == "CWAgent"
    assert cfg.cloudwatch_region is None and cfg.cloudwatch_endpoint_url is None
    assert cfg.cloudwatch_interval == 60.0
    assert cfg.cloudwatch_dry_run is False
    assert cfg.cloudwatch_buffer == 1800.0
    assert cfg.cloudwatch_device_dimensions == "both"
    assert cfg.cluster_name is None and cfg.instance_id is None


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


def test_cloudwatch_flags_from_env_and_flags() -> None:
    env = {
        "GPUSCOPE_CLOUDWATCH": "true",
        "GPUSCOPE_CLOUDWATCH_NAMESPACE": "Team/GPU",
        "GPUSCOPE_CLOUDWATCH_REGION": "eu-west-1",
        "GPUSCOPE_CLOUDWATCH_ENDPOINT_URL": "https://monitoring.eu-west-1.amazonaws.com",
        "GPUSCOPE_CLOUDWATCH_INTERVAL": "30",
        "GPUSCOPE_CLOUDWATCH_DRY_RUN": "yes",
        "GPUSCOPE_CLOUDWATCH_BUFFER": "600",
        "GPUSCOPE_CLOUDWATCH_DEVICE_DIMENSIONS": "agent",
        "GPUSCOPE_CLUSTER_NAME": "prod-east",
        "GPUSCOPE_INSTANCE_ID": "i-0123456789abcdef0",
    }
    cfg = parse([], env)
    assert cfg.cloudwatch is True
    assert cfg.cloudwatch_namespace == "Team/GPU"
    assert cfg.cloudwatch_region == "eu-west-1"
    assert cfg.cloudwatch_endpoint_url == "https://monitoring.eu-west-1.amazonaws.com"
    assert cfg.cloudwatch_interval == 30.0
    assert cfg.cloudwatch_dry_run is True
    assert cfg.cloudwatch_buffer == 600.0
    assert cfg.cloudwatch_device_dimensions == "agent"
    assert cfg.cluster_name == "prod-east"
    assert cfg.instance_id == "i-0123456789abcdef0"
    cfg = parse(["--no-cloudwatch-dry-run", "--cloudwatch-interval", "60", "--instance-id",
                 "imds", "--cloudwatch-endpoint-url", "http://127.0.0.1:5000",
                 "--cloudwatch-region", "us-gov-west-1"], env)
    assert cfg.cloudwatch_dry_run is False
    assert cfg.cloudwatch_interval == 60.0
    assert cfg.instance_id == "imds"
    assert cfg.cloudwatch_endpoint_url == "http://127.0.0.1:5000"
    assert cfg.cloudwatch_region == "us-gov-west-1"


def test_cloudwatch_region_from_AWS_REGION() -> None:
    # botocore reads AWS_DEFAULT_REGION only; AWS_REGION (documented, and what most other
    # SDKs read) was ignored: --cloudwatch with it alone exited 2, "no region given".
    assert parse(["--cloudwatch"], {"AWS_REGION": "eu-central-1"}
                 ).cloudwatch_region == "eu-central-1"
    env = {"AWS_REGION": "eu-central-1", "AWS_DEFAULT_REGION": "us-west-2"}
    assert parse(["--cloudwatch"], env).cloudwatch_region == "eu-central-1"
    assert parse(["--cloudwatch", "--cloudwatch-region", "us-east-2"], env
                 ).cloudwatch_region == "us-east-2"
    assert parse(["--cloudwatch"], {"AWS_DEFAULT_REGION": "us-west-2"}
                 ).cloudwatch_region is None  # botocore's own chain resolves it
    assert parse([], {"AWS_REGION": "eu-central-1"}).cloudwatch_region is None
    with pytest.raises(ConfigError, match="AWS_REGION: expected an AWS region"):
        parse(["--cloudwatch"], {"AWS_REGION": "Frankfurt"})


def test_node_name_falls_back_to_NODE_NAME_then_hostname() -> None:
    assert parse([], {"NODE_NAME": "from-downward-api"}).node_name == "from-downward-api"
    assert parse(["--node-name", "explicit"], {"NODE_NAME": "x"}).node_name == "explicit"
    # Only a hostname fallback lets a simulated exporter state its scenario's node instead.
    assert parse([]).node_name_is_hostname
    assert not parse([], {"NODE_NAME": "n"}).node_name_is_hostname
    assert not parse(["--node-name", "n"]).node_name_is_hostname


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--interval", "abc"], {}, "--interval: expected a number of seconds"),
        (["--interval", "-1"], {}, "--interval: expected a positive number"),
        (["--interval", "nan"], {}, "--interval: expected a positive number"),
        # float() reads other scripts' digits too: "٣" was 3 seconds.
        (["--interval", "\u0663"], {}, "--interval: expected a number of seconds"),
        # A day-long interval overflows the clock the sampler waits on; a microsecond one
        # spins a core.
        (["--interval", "1e10"], {}, "--interval: expected 0.1 to 3600 seconds"),
        (["--interval", "0.0000001"], {}, "--interval: expected 0.1 to 3600 seconds"),
        (["--listen", "9463"], {}, "--listen: expected HOST:PORT"),
        (["--listen", "0.0.0.0:70000"], {}, "--listen: port must be 0..65535"),
        # A bracket without its pair was dropped: "[::1:9" listened on [::1]:9.
        (["--listen", "[::1:9"], {}, "--listen: expected HOST:PORT"),
        (["--listen", "::1]:9463"], {}, "--listen: expected HOST:PORT"),
        # An IPv6 host without brackets (it bound the host ":", and failed at start).
        (["--listen", "::9463"], {}, "--listen: expected HOST:PORT"),
        (["--probe-listen", "::1:9"], {}, "--probe-listen: expected HOST:PORT"),
        (["--probe-listen", "[::1:9"], {}, "--probe-listen: expected HOST:PORT"),
        (["--probe-listen", "[[::1]]:9"], {}, "--probe-listen: expected HOST:PORT"),
        # int() reads other scripts' digits: "٣" (Arabic-Indic three) was a cap of 3.
        (["--max-process-series", "\u0663"], {}, "--max-process-series: expected a whole"),
        (["--max-container-series", "\u0661\u0660"], {},
         "--max-container-series: expected a whole number of series"),
        ([], {"GPUSCOPE_MAX_PROCESS_SERIES": "\uff15"}, "GPUSCOPE_MAX_PROCESS_SERIES: expected"),
        (["--source", "dcgm"], {}, "--source: expected one of nvml, simulated"),
        ([], {"GPUSCOPE_INTERVAL": "soon"}, "GPUSCOPE_INTERVAL: expected a number"),
        ([], {"GPUSCOPE_PROCESS_METRICS": "maybe"}, "GPUSCOPE_PROCESS_METRICS: expected true"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--scenario", "x.yaml"], {}, "--scenario only applies to --source simulated"),
        (["--cloudwatch-region", "US-EAST-1"], {}, "--cloudwatch-region: expected an AWS"),
        (["--cloudwatch-namespace", ""], {}, "--cloudwatch-namespace: expected 1 to 255"),
        (["--cloudwatch-namespace", "AWS/EC2"], {}, "are reserved for AWS"),
        (["--cloudwatch-namespace", "GPU\tmetrics"], {}, "expected printable ASCII"),
        (["--cloudwatch-endpoint-url", "monitoring.local"], {},
         "--cloudwatch-endpoint-url: expected an http:// or https:// URL"),
        (["--cloudwatch-endpoint-url", "http://host:99999"], {}, "bad port"),
        # botocore never uses user:password@ (requests are SigV4-signed), and the URL is in
        # every "PutMetricData failed" warning.
        (["--cloudwatch-endpoint-url", "https://user:secret@monitoring.local"], {},
         "--cloudwatch-endpoint-url: the URL must not hold credentials"),
        (["--cloudwatch-interval", "0"], {}, "--cloudwatch-interval: expected a positive"),
        (["--cloudwatch-interval", "7200"], {}, "--cloudwatch-interval: expected 1 to 3600"),
        (["--cloudwatch-buffer", "-5"], {}, "--cloudwatch-buffer: expected a positive"),
        (["--cloudwatch-buffer", "1e9"], {}, "--cloudwatch-buffer: expected at most 86400"),
        (["--cloudwatch-device-dimensions", "all"], {},
         "--cloudwatch-device-dimensions: expected one of agent, extended, both"),
        (["--cluster-name", ""], {}, "--cluster-name: expected 1 to 1024 characters"),
        (["--instance-id", "0123"], {}, "--instance-id: expected an instance ID"),
        ([], {"GPUSCOPE_CLOUDWATCH": "sure"}, "GPUSCOPE_CLOUDWATCH: expected true or false"),
        ([], {"GPUSCOPE_CLOUDWATCH_INTERVAL": "1m"}, "GPUSCOPE_CLOUDWATCH_INTERVAL: expected"),
        (["--cloudwatch-dry-run"], {}, "--cloudwatch-dry-run only applies with --cloudwatch"),
        # Bytes that are not UTF-8 (argv and the environment decode them to surrogates): a
        # label value that every /metrics render failed to encode, the connection dropped.
        (["--node-name", "n\udcff1"], {}, "--node-name: expected UTF-8 text, got 'n\\udcff1'"),
        ([], {"GPUSCOPE_NODE_NAME": "n\udcff"}, "GPUSCOPE_NODE_NAME: expected UTF-8 text"),
        ([], {"NODE_NAME": "n\udcff"}, "NODE_NAME: expected UTF-8 text"),
        (["--cluster-name", "c\udcff"], {}, "--cluster-name: expected UTF-8 text"),
        (["--instance-type", "p5\udcff"], {}, "--instance-type: expected UTF-8 text"),
    ],
)
def test_bad_values_give_one_line(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(argv, env)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
    assert "secret" not in str(info.value)


def test_ipv6_and_all_interfaces() -> None:
    assert parse(["--listen", "[::1]:9463"]).listen_host == "::1"
    assert parse(["--listen", ":9500"]).listen_host == "::"
