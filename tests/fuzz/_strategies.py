"""Strategies shared by the fuzz tests: YAML-shaped documents with awkward numbers."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

NUMBERS = st.one_of(
    st.integers(-3, 10), st.integers(), st.sampled_from([2**63, 2**64, 10**30, -(10**30)]),
    st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 5e-324, 1e308, -0.0]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12), st.sampled_from(
    ["80GiB", "0", "5m", "-5s", "1h30m", "1410MHz", "93%", "0/1", "4::1", "3g.40gb",
     "ml/p/c", "GPU-5fd4f087-86f3-7a43-b711-4771313afc50", "constant", "lost", "xid",
     "USD", "p5.48xlarge"]))


def yaml_like(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Scalars, lists and mappings nested a few levels, mapping keys mostly from ``keys``
    (the format's own words) and sometimes any text or an integer."""
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(keys, st.text(max_size=6), st.integers()), inner,
                            max_size=5),
        ),
        max_leaves=25,
    )
