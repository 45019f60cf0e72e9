from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpuscope.exporter.config import build_parser as exporter_parser
from gpuscope.exporter.flags import (
    ConfigError,
    Flag,
    StartupError,
    ascii_number,
    boolean,
    build_parser,
    positive_seconds,
    read_flags,
    run_main,
)
from tests.conftest import REPO

FLAGS = (
    Flag("--wait", positive_seconds, "5", "seconds"),
    Flag("--fast", boolean, "false", "go fast", boolean=True),
    Flag("--name", str, None, "a name"),
)


def test_a_whole_number_is_ascii_digits_only() -> None:
    """The exporter's and the dashboard's integer flags: ``int()`` and ``str.isdigit()`` also
    take other scripts' digits ("\u0663" is 3) and superscripts."""
    assert ascii_number(" 2000 ") == 2000
    assert ascii_number("007") == 7
    for bad in ("\u0663", "1\u0660", "\uff15", "\u00b2", "", "-1", "+1", "1e3", "1_000", "1.0"):
        assert ascii_number(bad) is None, bad
    assert ascii_number("9" * 18) == int("9" * 18)
    assert ascii_number("9" * 19) is None
    assert ascii_number("1234", max_digits=3) is None


def read(argv: list[str], env: dict[str, str]) -> tuple[dict[str, object], set[str]]:
    return read_flags(build_parser("prog", "d", "e", FLAGS), FLAGS, argv, env)


def test_precedence_flag_then_env_then_default() -> None:
    assert read([], {}) == ({"wait": 5.0, "fast": False, "name": None}, set())
    values, explicit = read([], {"GPUSCOPE_WAIT": "2", "GPUSCOPE_FAST": "yes"})
    assert (values["wait"], values["fast"], explicit) == (2.0, True, {"wait", "fast"})
    values, _ = read(["--wait", "9", "--no-fast"], {"GPUSCOPE_WAIT": "2", "GPUSCOPE_FAST": "1"})
    assert (values["wait"], values["fast"]) == (9.0, False)
    # An empty variable is unset (a Helm chart's empty value must not become an error).
    assert read([], {"GPUSCOPE_WAIT": ""})[0]["wait"] == 5.0


def test_errors_name_their_origin() -> None:
    with pytest.raises(ConfigError, match=r"^GPUSCOPE_WAIT: expected a number of seconds"):
        read([], {"GPUSCOPE_WAIT": "soon"})
    with pytest.raises(ConfigError, match=r"^--wait: expected a positive number"):
        read(["--wait", "-3"], {})


def test_run_main_turns_errors_into_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # keep pytest's own handlers
    def parse(argv: object) -> str:
        raise ConfigError("--x: bad")

    assert run_main("prog", parse, lambda c: "info", lambda c, s: 0, []) == 2
    assert capsys.readouterr().err == "prog: error: --x: bad\n"

    def start(cfg: str, stop: object) -> int:
        raise StartupError("cannot listen on 127.0.0.1:1: denied")

    assert run_main("prog", lambda a: "cfg", lambda c: "info", start, []) == 2
    assert capsys.readouterr().err == "prog: error: cannot listen on 127.0.0.1:1: denied\n"


@pytest.mark.parametrize("command", ["gpuscope-exporter", "gpuscope-dashboard",
                                     "gpuscope-alarms"])
def test_every_command_has_version(command: str) -> None:
    script = Path(sys.executable).parent / command
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"{command} {declared}\n", "")


def test_help_lists_the_choices() -> None:
    text = exporter_parser().format_help()
    assert "--source {nvml,simulated}" in text
    assert "--log-level {debug,info,warning,error}" in text
    assert "--version" in text
