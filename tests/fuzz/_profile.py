"""The fuzz tests' Hypothesis settings: small and reproducible in CI, scalable by hand.

In CI every property runs a fixed, derandomized set of examples (``derandomize=True``, no
example database), so a run is repeatable and the whole directory stays within about a
minute. For a longer fuzz, set ``GPUSCOPE_FUZZ_EXAMPLES``: every property then runs that
many examples, drawn at random (a fresh seed per run, printed with any failure)::

    GPUSCOPE_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/fuzz --timeout=0 -p no:cacheprovider

(``make fuzz`` is meant to do just that; ``--timeout=0`` lifts pyproject's 120 s per test.)
About 3000 examples per property take ten minutes on two cores. A failure prints the
smallest input found and a ``@reproduce_failure`` line; keep the input as an ``@example``
or a plain regression test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, settings

F = TypeVar("F", bound=Callable[..., object])

ENV = "GPUSCOPE_FUZZ_EXAMPLES"


def _requested() -> int | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise RuntimeError(f"{ENV} must be a whole number of examples, got {raw!r}") from None
    if n < 1:
        raise RuntimeError(f"{ENV} must be >= 1, got {n}")
    return n


LONG = _requested()


def fuzz(ci_examples: int) -> Callable[[F], F]:
    """``@settings`` for one property: ``ci_examples`` derandomized examples in CI, or
    ``$GPUSCOPE_FUZZ_EXAMPLES`` random ones when that is set."""
    return settings(
        max_examples=LONG or ci_examples,
        derandomize=LONG is None,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )
