"""Strategies shared by the fuzz tests: YAML-shaped documents with awkward numbers."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
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


# -- mutations of a valid document -------------------------------------------------------------


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (keys and indices), the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@st.composite
def mutated(
    draw: st.DrawFn, docs: Sequence[Any], bad: st.SearchStrategy[Any],
    keys: st.SearchStrategy[Any],
) -> Any:
    """One of ``docs`` (deep-copied) after one to three edits at random paths: a value
    replaced by one of ``bad``, an entry dropped, a key renamed (to one of ``keys`` or a near
    miss), an entry added, a list item duplicated, or a subtree copied elsewhere."""
    doc = copy.deepcopy(draw(st.sampled_from(docs)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        target = get(doc, where)
        op = draw(st.sampled_from(["replace", "drop", "rename", "add", "duplicate", "swap"]))
        if op == "replace" and where:
            get(doc, where[:-1])[where[-1]] = draw(bad)
        elif op == "drop" and isinstance(target, dict | list) and target:
            key = draw(st.sampled_from(list(target.keys()) if isinstance(target, dict)
                                       else range(len(target))))
            del target[key]
        elif op == "rename" and isinstance(target, dict) and target:
            key = draw(st.sampled_from(list(target)))
            new = draw(st.one_of(keys, st.just(str(key)[:-1] or "x"), st.just(str(key) + "s")))
            if new not in target:
                target[new] = target.pop(key)
        elif op == "add" and isinstance(target, dict):
            target[draw(keys)] = draw(bad)
        elif op == "duplicate" and isinstance(target, list) and target:
            target.append(copy.deepcopy(draw(st.sampled_from(target))))
        elif op == "swap" and where:
            other = get(doc, draw(st.sampled_from(paths(doc))))
            get(doc, where[:-1])[where[-1]] = copy.deepcopy(other)
    return doc
