"""Reading the small text files the programs are given (a scenario, a price table, a
basic-auth file): read up to a limit, so that a wrong path (``/dev/zero``, a log, a disk
image) is one error line instead of the machine's memory; and writing the generated ones
(:func:`write_text_atomic`) so that a failed write leaves the old file whole."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that a reader, a full disk or a crash part-way
    never leaves a truncated file: the text goes to a temporary file in the same folder,
    flushed to disk, which then replaces ``path`` in one step (``os.replace``); the old
    file's permission bits are kept, a symbolic link's target is what is replaced. A path
    that exists and is not a regular file (``/dev/stdout``, a FIFO) is written directly.
    Raises OSError (the temporary file removed) where it cannot be written."""
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        mode = None
    else:
        if not stat.S_ISREG(st.st_mode):
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            return
        mode = stat.S_IMODE(st.st_mode)
    folder, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:  # a new file: the mode open() would give it (0666 less the umask)
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
