"""``exporter/repeats.py``: a place failing the same way every round logs one traceback, then
one line every ``every`` seconds with how many times it came back; another error logs its
traceback at once; the first success after failures says so."""

from __future__ import annotations

import logging

import pytest

from gpuscope.exporter.repeats import Repeats

log = logging.getLogger("tests.repeats")


def fail(repeats: Repeats, error: Exception) -> None:
    try:
        raise error
    except Exception:
        repeats.failed()


def test_the_same_error_every_round_is_one_traceback_then_a_line_every_ten_minutes(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    repeats = Repeats(log, "attribution", every=600.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="tests.repeats"):
        for second in range(1200):  # 20 minutes at a round a second: the next line at 1200
            now[0] = float(second)
            fail(repeats, KeyError("pod"))
    records = caplog.records
    assert [r.exc_info is not None for r in records] == [True, False]
    assert records[0].getMessage() == ("attribution failed (the same error again is logged "
                                       "every 10 min)")
    assert records[1].getMessage() == ("attribution failed again, 600 more time(s) in the "
                                       "last 10 min: KeyError: 'pod'")


def test_another_error_logs_its_traceback_and_a_success_says_it_works_again(
        caplog: pytest.LogCaptureFixture) -> None:
    repeats = Repeats(log, "reading device GPU-1", clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="tests.repeats"):
        fail(repeats, ValueError("a"))
        fail(repeats, ValueError("a"))
        fail(repeats, ValueError("b"))  # another message: another error
        repeats.succeeded()
        repeats.succeeded()  # (once)
        fail(repeats, ValueError("a"))  # after a success: new again
    assert [(r.levelno, r.exc_info is not None) for r in caplog.records] == [
        (logging.ERROR, True), (logging.ERROR, True), (logging.INFO, False),
        (logging.ERROR, True)]
    assert caplog.records[2].getMessage() == "reading device GPU-1 works again after 3 failure(s)"
