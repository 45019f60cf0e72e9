"""Fuzzing the command lines and ``GPUSCOPE_*`` variables of both CLIs.

Documented (``exporter/flags.py``): any bad flag or environment value raises
:class:`ConfigError` whose text is one line naming the flag or variable; ``run_main`` prints
it as ``<prog>: error: ...`` and exits 2. Every flag of both flag tables gets generated
values, on the command line (``--flag=value`` and ``--flag value``) and in its variable;
``parse_config`` must either accept them or raise ``ConfigError`` naming that flag or
variable, never anything else. A few real processes check exit code 2, one stderr line and
no traceback. Settings: ``tests/fuzz/_profile.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import gpuscope.dashboard.cli as dashboard_cli
import gpuscope.exporter.config as exporter_config
from gpuscope.exporter.flags import ConfigError, Flag
from tests.conftest import REPO
from tests.fuzz._profile import fuzz

EXPORTER_FLAGS: tuple[Flag, ...] = exporter_config._FLAGS
DASHBOARD_FLAGS: tuple[Flag, ...] = dashboard_cli._FLAGS
DASHBOARD_SOURCES = {"--prometheus", "--targets", "--demo"}


def parse_exporter(argv: Sequence[str], env: Mapping[str, str]) -> object:
    return exporter_config.parse_config(list(argv), dict(env), hostname=lambda: "fuzz-node")


def parse_dashboard(argv: Sequence[str], env: Mapping[str, str]) -> object:
    return dashboard_cli.parse_config(list(argv), dict(env))


def check(parse: Callable[[Sequence[str], Mapping[str, str]], object], argv: Sequence[str],
          env: Mapping[str, str], names: Sequence[str]) -> None:
    """Parses, or fails with one line naming one of ``names``."""
    try:
        parse(argv, env)
    except ConfigError as exc:
        text = str(exc)
        assert text and text.splitlines() == [text], repr(text)
        if names:
            assert any(n in text for n in names), (text, names)


# Values near the edges of every converter (ports, seconds, URLs, regions, IDs, booleans,
# lists), and anything at all.
EDGES = st.sampled_from([
    "", " ", "0", "1", "-1", "1e309", "-0", "nan", "NaN", "inf", "-inf", "0x10", "1_000",
    "3600", "3600.0001", "86401", "true", "false", "yes", "on", "off", "maybe", "TRUE ",
    "127.0.0.1:9463", ":9463", ":99999", ":-1", "[::1]:80", "::1", "[::1", "host:", ":²",
    ":" + "9" * 5000, "9" * 400, "http://x:1", "https://x", "http://[::1", "http://x:99999",
    "http://x:port", "ftp://x", "http://\uff03x/", "http://", "a=http://x:1/m", "=http://x",
    "http://x:1/,http://x:1/", ",", "a/b,c", "vendor.com/gpu,*", "us-east-1", "US-EAST-1",
    "AWS/EC2", "CWAgent", "x" * 256, "i-0123456789abcdef0", "i-XYZ", "imds", "agent", "both",
    "debug", "INFO", "simulated", "nvml", "/dev/null", "-", "--", "--listen", "x\ny", "\x00",
    "\t", "é", "\ud800",
])
VALUES = st.one_of(EDGES, st.text(max_size=40), st.lists(EDGES, max_size=3).map(",".join))


@st.composite
def flag_inputs(draw: st.DrawFn, flags: tuple[Flag, ...], dashboard: bool,
                ) -> tuple[list[str], dict[str, str], list[str]]:
    """argv, env and the names an error may give, for one generated value of one flag."""
    flag = draw(st.sampled_from(flags))
    value = draw(VALUES)
    base = [] if not dashboard or flag.flag in DASHBOARD_SOURCES else ["--demo"]
    where = draw(st.sampled_from(["argv=", "argv", "env"]))
    if where == "env":
        return base, {flag.env: value}, [flag.flag, flag.env]
    if flag.boolean:  # booleans take no separate value: --flag, --no-flag, --flag=value
        form = draw(st.sampled_from([f"{flag.flag}={value}", flag.flag,
                                     "--no-" + flag.flag.removeprefix("--")]))
        return [*base, form], {}, [flag.flag]
    if where == "argv=":
        return [*base, f"{flag.flag}={value}"], {}, [flag.flag]
    return [*base, flag.flag, value], {}, [flag.flag]


@fuzz(400)
@given(case=flag_inputs(EXPORTER_FLAGS, dashboard=False))
@example(case=(["bogus\nargument"], {}, []))  # argparse quoted it raw: two lines
@example(case=(["--listen", ":" + "9" * 5000], {}, ["--listen"]))
@example(case=([], {"GPUSCOPE_LISTEN": ":²"}, ["GPUSCOPE_LISTEN"]))
@example(case=(["--cloudwatch-endpoint-url=http://[::1"], {}, ["--cloudwatch-endpoint-url"]))
@example(case=(["--listen=--"], {}, ["--listen"]))  # argparse gave the converter a list
def test_exporter_flag_values_parse_or_fail_naming_the_flag(
    case: tuple[list[str], dict[str, str], list[str]],
) -> None:
    check(parse_exporter, *case)


@fuzz(300)
@given(case=flag_inputs(DASHBOARD_FLAGS, dashboard=True))
@example(case=(["--demo", "bogus\nargument"], {}, []))
@example(case=(["--targets", "http://x:1/,http://x:1/"], {}, ["--targets"]))
@example(case=([], {"GPUSCOPE_DEMO": "false"}, ["--demo"]))
@example(case=(["--targets=--"], {}, ["--targets"]))  # argparse gave the converter a list
def test_dashboard_flag_values_parse_or_fail_naming_the_flag(
    case: tuple[list[str], dict[str, str], list[str]],
) -> None:
    check(parse_dashboard, *case)


def arg_words(flags: tuple[Flag, ...]) -> st.SearchStrategy[str]:
    names = [f.flag for f in flags] + ["--no-" + f.flag.removeprefix("--") for f in flags
                                       if f.boolean]
    prefixes = [n[:k] for n in names for k in (3, 5, 8) if len(n) > k]
    word = st.one_of(st.sampled_from(names), st.sampled_from(prefixes), EDGES,
                     st.text(max_size=12), st.builds(lambda n, v: f"{n}={v}",
                                                     st.sampled_from(names), VALUES))
    # -h/--help (and its prefixes) print the help and exit 0 on purpose.
    return word.filter(lambda w: not w.startswith(("-h", "--h")))


def env_maps(flags: tuple[Flag, ...]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from([f.env for f in flags] + ["NODE_NAME"]), VALUES,
                           max_size=4)


@fuzz(200)
@given(argv=st.lists(arg_words(EXPORTER_FLAGS), max_size=6), env=env_maps(EXPORTER_FLAGS))
def test_exporter_any_command_line_parses_or_fails_with_one_line(
    argv: list[str], env: dict[str, str],
) -> None:
    check(parse_exporter, argv, env, [])


@fuzz(150)
@given(argv=st.lists(arg_words(DASHBOARD_FLAGS), max_size=6), env=env_maps(DASHBOARD_FLAGS))
def test_dashboard_any_command_line_parses_or_fails_with_one_line(
    argv: list[str], env: dict[str, str],
) -> None:
    check(parse_dashboard, argv, env, [])


# -- real processes ----------------------------------------------------------------------------

BAD_PRICES = "p5.48xlarge: " + "9" * 400 + "\n"

# (program, argv, extra environment, what the one error line must contain)
PROCESS_CASES: dict[str, tuple[str, list[str], dict[str, str], str]] = {
    "exporter-nan-interval": ("exporter", ["--interval=nan"], {}, "--interval:"),
    "exporter-port": ("exporter", ["--listen", ":99999"], {}, "--listen:"),
    "exporter-env": ("exporter", [], {"GPUSCOPE_INTERVAL": "-1"}, "GPUSCOPE_INTERVAL:"),
    "exporter-dashdash": ("exporter", ["--source=simulated", "--scenario=--"], {},
                          "error: --: cannot read"),
    "exporter-newline-argument": ("exporter", ["bogus\nargument"], {},
                                  "unrecognized arguments: bogus argument"),
    "dashboard-refresh": ("dashboard", ["--demo", "--refresh=0"], {}, "--refresh:"),
    "dashboard-url": ("dashboard", ["--prometheus=ftp://x"], {}, "--prometheus:"),
    "dashboard-env": ("dashboard", [], {"GPUSCOPE_TARGETS": "http://x:1/,http://x:1/"},
                      "GPUSCOPE_TARGETS:"),
    "dashboard-two-sources": ("dashboard", ["--demo", "--prometheus=http://x:1"], {},
                              "choose one data source"),
    "dashboard-prices": ("dashboard", ["--prometheus=http://127.0.0.1:1", "--prices=PRICES",
                                       "--listen=127.0.0.1:0"], {},
                         "--prices PRICES: p5.48xlarge: expected a price >= 0"),
}


def test_processes_exit_2_with_one_line(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(BAD_PRICES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    procs: dict[str, tuple[subprocess.Popen[str], str]] = {}
    for name, (prog, argv, extra, expect) in PROCESS_CASES.items():
        argv = [a.replace("PRICES", str(prices)) for a in argv]
        procs[name] = (subprocess.Popen(
            [sys.executable, "-m", f"gpuscope.{prog}", *argv], cwd=REPO, env={**env, **extra},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ), expect.replace("PRICES", str(prices)))
    failures: list[Any] = []
    for name, (proc, expect) in procs.items():
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append((name, "still running"))
            continue
        lines = err.splitlines()
        prog = PROCESS_CASES[name][0]
        ok = (proc.returncode == 2 and "Traceback" not in err and len(lines) == 1 and not out
              and lines[0].startswith(f"gpuscope-{prog}: error: ") and expect in lines[0])
        if not ok:
            failures.append((name, proc.returncode, err))
    if failures:
        pytest.fail(f"{failures}")
