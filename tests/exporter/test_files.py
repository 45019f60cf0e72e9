"""Reading the small text files the programs are given, up to a limit
(:mod:`gpuscope.exporter.files`), and each loader's one line for a file that is not one: a
scenario, a price table, a basic-auth file given ``/dev/zero`` (which never ends) or a
file past its limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.dashboard.auth import AuthFileError, load_credentials
from gpuscope.dashboard.prices import PriceError, load_prices
from gpuscope.exporter.files import TooLarge, read_text, write_text_atomic
from gpuscope.exporter.sources.scenario.load import load_scenario
from gpuscope.exporter.sources.scenario.model import ScenarioError


def test_a_file_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """A new file gets open()'s mode, an old one keeps its own; a symbolic link is kept
    and its target replaced; a device is written directly (never replaced by a file); a
    write that fails leaves no temporary file."""
    new = tmp_path / "new.txt"
    write_text_atomic(new, "é\n")
    assert new.read_text(encoding="utf-8") == "é\n"
    old = tmp_path / "old.txt"
    old.write_text("old\n")
    old.chmod(0o600)
    link = tmp_path / "link.txt"
    link.symlink_to(old.name)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and old.read_text() == "new\n"
    assert old.stat().st_mode & 0o777 == 0o600
    write_text_atomic("/dev/null", "nothing\n")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(OSError):
        write_text_atomic(tmp_path, "a folder\n")
    with pytest.raises(OSError):
        write_text_atomic("/dev/full", "a full disk\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "new.txt", "old.txt"]


def test_a_file_is_read_up_to_its_limit(tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("é" * 10)  # 20 bytes
    assert read_text(f, 20) == "é" * 10
    with pytest.raises(TooLarge, match="larger than 0 KiB"):
        read_text(f, 19)
    with pytest.raises(TooLarge, match="larger than 1 MiB"):
        read_text("/dev/zero", 1 << 20)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(UnicodeDecodeError):
        read_text(f, 100)


@pytest.mark.parametrize(("load", "error"), [
    (load_scenario, ScenarioError),
    (load_prices, PriceError),
    (load_credentials, AuthFileError),
])
def test_a_never_ending_file_is_one_line(load: object, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        load("/dev/zero")  # type: ignore[operator]
    text = str(info.value)
    assert text.startswith("/dev/zero: larger than ") and "\n" not in text
