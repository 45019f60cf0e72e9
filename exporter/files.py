"""Reading the small text files the programs are given (a scenario, a price table, a
basic-auth file): read up to a limit, so that a wrong path (``/dev/zero``, a log, a disk
image) is one error line instead of the machine's memory."""

from __future__ import annotations

import os


class TooLarge(ValueError):
    """The file is larger than the limit it was read with."""


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes. Raises :class:`TooLarge` past
    the limit ("larger than N MiB"), OSError where it cannot be read, UnicodeDecodeError
    where it is not UTF-8 and ValueError for a path the OS refuses (a NUL byte)."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise TooLarge(f"larger than {size}: not a file of this kind")
    return raw.decode("utf-8")
