"""Formatting of numbers, money, durations and times for the page."""

from __future__ import annotations

import time


def money(value: float | None, per_hour: bool = False) -> str:
    """Dollars with cents, as the tables show them (``$21.96``, ``$0.80/h``); an amount
    above 0 that rounds to nothing is ``<$0.01``."""
    if value is None:
        return "unknown"
    text = "<$0.01" if 0 < value < 0.005 else f"${value:,.2f}"
    return text + ("/h" if per_hour else "")


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def duration(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h 05m``, ``2d 4h``."""
    if seconds is None:
        return "n/a"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" if s % 60 == 0 or s >= 600 else f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600}h"


def clock(ts: float, now: float | None = None) -> str:
    """UTC time of day, said (``14:03:07 UTC``), with the date when not today (UTC)."""
    t = time.gmtime(ts)
    today = time.gmtime(time.time() if now is None else now)
    if time.strftime("%Y-%m-%d", t) == time.strftime("%Y-%m-%d", today):
        return time.strftime("%H:%M:%S UTC", t)
    return time.strftime("%Y-%m-%d %H:%M UTC", t)


def stamp(ts: float) -> str:
    """UTC date and time to the second (``2026-11-30 14:03:07 UTC``), whatever the day: a
    CSV's times, read later and elsewhere."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"
