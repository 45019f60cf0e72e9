"""Flag machinery shared by ``gpuscope-exporter`` and ``gpuscope-dashboard``.

Flags are declared as data (:class:`Flag`); :func:`read_flags` resolves each one from the
command line, else ``GPUSCOPE_<FLAG>``, else its default, converting with the flag's own
function. Any bad value raises :class:`ConfigError` whose text is one line naming the flag
or variable; :func:`run_main` prints it as ``<prog>: error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, TypeVar

ENV_PREFIX = "GPUSCOPE_"

C = TypeVar("C")


class ConfigError(Exception):
    """A bad flag or environment value; ``str()`` is the single line to show the user."""


class StartupError(Exception):
    """Bad input found while starting (a scenario or price file, a busy port); one line."""


# -- converters: str -> value, ValueError with a short reason on bad input ------------------
def ascii_number(value: str, max_digits: int = 18) -> int | None:
    """``value`` (white space around it ignored) as a whole number when it is ASCII digits
    only, at most ``max_digits`` of them; else None. ``int()`` and ``str.isdigit()`` also
    take other scripts' digits (``"٣"`` is 3) and superscripts; a flag takes neither."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > max_digits:
        return None
    return int(text)


#: What making or binding an IPv6 socket fails with where the kernel has no IPv6
#: (``ipv6.disable=1``): the servers then take "every address" (``::``) as every IPv4 one.
IPV6_UNAVAILABLE = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT})


def split_listen(value: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[IPV6]:PORT``) as its host (brackets taken off, may be empty) and
    port (ASCII digits, at most 5; the range is the caller's to check); None where it is not
    of that form: no port, a bracket that is not one of a pair around the whole host
    (``[::1:9`` is not ``[::1]:9``), or an IPv6 host without its brackets (``::9463`` would
    bind the host ``:``; ``::1:9463`` is no one address and port)."""
    host, sep, port_text = value.rpartition(":")
    port = ascii_number(port_text, 5) if port_text == port_text.strip() else None
    if not sep or port is None:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    if "[" in host or "]" in host:
        return None
    return host, port


def ascii_float(value: str) -> float | None:
    """``value`` as a float when ``float()`` reads it and it is ASCII only, else None:
    ``float()`` also takes other scripts' digits (``"٣"`` is 3.0); a flag does not."""
    if not value.isascii():
        return None
    try:
        return float(value)
    except ValueError:
        return None


def positive_seconds(value: str) -> float:
    seconds = ascii_float(value)
    if seconds is None:
        raise ValueError(f"expected a number of seconds, got {value!r}")
    if not 0 < seconds < float("inf"):  # also rejects nan
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    return seconds


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """A converter of seconds in ``[low, high]``: an interval outside it is a mistake (a
    day-long sampling interval overflows the clocks the threads wait on; a microsecond one
    spins a core)."""
    def convert(value: str) -> float:
        seconds = positive_seconds(value)
        if not low <= seconds <= high:
            raise ValueError(f"expected {low:g} to {high:g} seconds, got {value!r}")
        return seconds
    return convert


def boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


class _Choice:
    """A converter that accepts one of ``options``; ``--help`` lists them."""

    def __init__(self, options: tuple[str, ...]) -> None:
        self.options = options

    def __call__(self, value: str) -> str:
        if value not in self.options:
            raise ValueError(f"expected one of {', '.join(self.options)}, got {value!r}")
        return value


def choice(*options: str) -> Callable[[str], str]:
    return _Choice(options)


def text(value: str) -> str:
    return value


log_level = choice("debug", "info", "warning", "error")


# -- declaration and parsing ----------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    flag: str
    convert: Callable[[str], Any]
    default: str | None
    help: str
    boolean: bool = False

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse quotes arguments raw ("unrecognized arguments: a<newline>b"): one line.
        raise ConfigError(" ".join(message.split()))


def version() -> str:
    """The installed gpuscope distribution's version (pyproject.toml), or ``unknown`` when
    running from a tree that was never installed."""
    # Imported here: importlib.metadata costs ~25 ms and ~1 MiB at start-up, on every node,
    # for a value only --version and the User-Agent need.
    import importlib.metadata

    try:
        return importlib.metadata.version("gpuscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: like argparse's own, but the version is looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


def build_parser(
    prog: str, description: str, epilog: str, flags: Sequence[Flag]
) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=description, epilog=epilog)
    parser.add_argument("--version", action=_VersionAction)
    for f in flags:
        if f.boolean:
            parser.add_argument(f.flag, dest=f.dest, action=argparse.BooleanOptionalAction,
                                default=None, help=f"{f.help} [env {f.env}]")
        else:
            default = f"; default {f.default}" if f.default else ""
            # A choice flag shows its choices as argparse does ({nvml,simulated}).
            metavar = (f"{{{','.join(f.convert.options)}}}" if isinstance(f.convert, _Choice)
                       else f.dest.upper())
            parser.add_argument(f.flag, dest=f.dest, metavar=metavar, default=None,
                                help=f"{f.help} [env {f.env}{default}]")
    return parser


def read_flags(
    parser: argparse.ArgumentParser,
    flags: Sequence[Flag],
    argv: Sequence[str] | None,
    environ: Mapping[str, str] | None,
) -> tuple[dict[str, Any], set[str]]:
    """Values by ``dest`` (flag > ``GPUSCOPE_*`` > default) and the dests set explicitly.
    An empty environment variable counts as unset, except for booleans (empty = false)."""
    env = os.environ if environ is None else environ
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for f in flags:
        given = getattr(args, f.dest)
        origin, raw = None, None
        if given is not None:
            explicit.add(f.dest)
            if f.boolean:
                values[f.dest] = given
                continue
            if not isinstance(given, str):
                # argparse drops a "--" value: --listen=-- arrives as [], not "--".
                given = "--"
            origin, raw = f.flag, given
        elif f.env in env and (env[f.env] != "" or f.boolean):
            explicit.add(f.dest)
            origin, raw = f.env, env[f.env]
        if raw is None:
            values[f.dest] = f.convert(f.default) if f.default is not None else None
            continue
        try:
            values[f.dest] = f.convert(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {exc}") from None
    return values, explicit


def run_main(
    prog: str,
    parse: Callable[[Sequence[str] | None], C],
    level_of: Callable[[C], str],
    run: Callable[[C, threading.Event], int],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse, set up logging, stop on SIGTERM/SIGINT, and turn :class:`ConfigError` and
    :class:`StartupError` into one ``<prog>: error: ...`` line and exit code 2."""
    try:
        cfg = parse(argv)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=level_of(cfg).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run(cfg, stop)
    except StartupError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
