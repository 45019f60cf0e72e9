"""PromQL built safely: every user-given value is validated (:mod:`.source`) *and* escaped here
before it reaches a query, and every regex alternative is escaped twice (regex, then string)."""


from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_label_value(value: str) -> str:
    """``value`` as the inside of a double-quoted PromQL string literal.

    Backslash and double quote are escaped, newline/CR/tab get their escapes and every other
    control character ``\\uXXXX``, so no input can close the literal and append PromQL.
    """
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def selector(metric: str, matchers: Mapping[str, str] | None = None, **equal: str) -> str:
    """``metric{label="value", ...}`` with every value escaped.

    ``matchers`` maps label names to raw PromQL matcher suffixes built by this module only
    (e.g. ``'!=""'``); ``equal`` are user-facing equality matchers, escaped here.
    """
    if not _METRIC_NAME.match(metric):
        raise ValueError(f"bad metric name {metric!r}")
    parts = []
    for name, op in (matchers or {}).items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f"{name}{op}")
    for name, value in equal.items():
        if not _LABEL_NAME.match(name):
            raise ValueError(f"bad label name {name!r}")
        parts.append(f'{name}="{escape_label_value(value)}"')
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric



_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$-")


def any_of(values: Sequence[str]) -> str:
    """A PromQL regex matcher body (already escaped for the string literal) matching exactly
    one of ``values``: regex metacharacters escaped first, then the literal escaping."""
    alternatives = ("".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in v)
                    for v in values)
    return escape_label_value("|".join(alternatives))


def duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


