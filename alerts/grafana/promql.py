"""Scoping a PromQL expression to a dashboard's template variables.

The dashboards take their verdict expressions from the rule file by name
(:mod:`.rules`), so the same text that the alerts evaluate is what a panel shows. A panel
must still be narrowed to the selected cluster (and, on the node dashboard, node): that is
done here by adding label matchers to every vector selector of the expression, and the
cluster label to every ``by``/``on`` grouping, so that joins stay inside one cluster when
several are selected (Thanos, Mimir and federated setups carry ``cluster`` as an external
label; where no series has one, the added matcher ``=~".*"`` and grouping change nothing).

This is a tokenizer that knows just enough of the grammar: string literals, Grafana
variables, label-matcher braces, range and subquery brackets, grouping lists, function calls
and keywords. Every scoped query of the shipped dashboards is run against a real Prometheus
by ``tests/alerts/test_grafana.py``, so a grammar it misreads fails there.

Why not a parser. ``promql-parser`` (PyPI 0.12, the Python binding of GreptimeTeam's Rust
parser) was measured to replace it: a 1.5 MB wheel (4.9 MB installed), ~1.4 ms to import,
+1.8 MiB RSS, and it parses every expression of the rule file and the dashboards the way
Prometheus does (Prometheus 2.42's ``/api/v1/format_query`` formats each expression and the
library's ``prettify()`` of it alike). It cannot do this module's job without a
hand-written printer on top:

- its tree cannot be changed. Nodes have no constructors; ``AggregateExpr.modifier``,
  ``BinaryExpr.modifier``, ``.expr``, ``.lhs``, ``Call.args`` are read-only; the writable
  ``VectorSelector.matchers``, ``AggModifier.labels`` and ``BinModifier.matching`` change a
  detached copy (the parent prints as before), and ``transform()`` keeps a returned node as
  it was parsed, not as it was changed. A change has to be written as PromQL text and
  ``parse()``-d, node by node;
- its ``str()`` prints wrong PromQL: sub-second parts of durations are dropped
  (``x[59999ms]`` prints ``x{}[59s]``: the rule file has 51 such windows, any of which a
  panel may take by name;
  ``x[250ms]`` prints ``x{}[0s]``, which Prometheus refuses; ``offset 1500ms`` prints
  ``offset 1s``), and ``str(Matcher)`` does not escape ``"`` or ``\\``. ``prettify()`` prints
  durations and strings right but ignores the changed matchers;
- ``[$__rate_interval]`` is not PromQL and does not parse (placeholder durations would be
  needed), and a raw string with a backslash (``x{a=`\\d`}``) is refused.

Writing the changed selectors, aggregations and binary operators back as text would put as
much grammar in this module as the tokenizer has, plus a native dependency: not done.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# Tokens, in priority order. Strings first (they may hold any character), then the rest.
_TOKEN = re.compile(
    r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<comment>\#[^\n]*)
    # A Grafana variable outside a string (offset $__interval, [${__range}]): copied as it
    # is, never read as a metric name or as selector braces.
  | (?P<variable>\$(?:\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<number>[0-9.][0-9A-Za-z_.]*)
  | (?P<space>\s+)
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)

# Words that are never metric names where they stand in an expression.
_KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "atan2", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan",
    # Aggregation operators: reserved, and may be followed by `by`/`without` before `(`.
    "sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "limitk", "limit_ratio",
})
_GROUPINGS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ScopeError(ValueError):
    """An expression this module cannot scope (unbalanced brackets): one line."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(expr):
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group()))
    return out


def _next_significant(tokens: Sequence[tuple[str, str]], i: int) -> int:
    """Index of the first token at or after ``i`` that is not space or a comment."""
    while i < len(tokens) and tokens[i][0] in ("space", "comment"):
        i += 1
    return i


def scope(expr: str, matchers: Mapping[str, str], group_labels: Sequence[str] = ()) -> str:
    """``expr`` with ``matchers`` (label name -> matcher text such as ``=~"$cluster"``)
    added to every vector selector, and ``group_labels`` added to every ``by (...)`` and
    ``on (...)`` list that lacks them (``without``/``ignoring`` and the label lists of
    ``group_left``/``group_right`` are left alone)."""
    for name in (*matchers, *group_labels):
        if not _LABEL.match(name):
            raise ScopeError(f"not a label name: {name!r}")
    inject = ", ".join(f"{k}{v}" for k, v in matchers.items())
    tokens = _tokens(expr)
    out: list[str] = []
    i = 0
    depth_paren = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "other" and text == "[":
            # A range or subquery: copied to its closing bracket.
            j = i
            while j < len(tokens) and tokens[j][1] != "]":
                out.append(tokens[j][1])
                j += 1
            if j == len(tokens):
                raise ScopeError(f"unclosed '[' in: {' '.join(expr.split())}")
            out.append("]")
            i = j + 1
            continue
        if kind == "other" and text == "{":
            # A selector with no metric name ({__name__=~"..."}): scoped the same way.
            i = _copy_braces(tokens, i, out, inject)
            continue
        if kind == "ident":
            word = text.lower()
            nxt = _next_significant(tokens, i + 1)
            follows = tokens[nxt][1] if nxt < len(tokens) else ""
            if word in _GROUPINGS:
                out.append(text)
                if follows == "(":
                    out.extend(t for _, t in tokens[i + 1:nxt])
                    i = _copy_grouping(tokens, nxt, out,
                                       group_labels if word in ("by", "on") else ())
                else:
                    i += 1
                continue
            if word in _KEYWORDS or follows == "(":
                # A keyword, or a function or aggregation being called.
                out.append(text)
                i += 1
                continue
            # A metric name: its selector gets the matchers.
            out.append(text)
            if follows == "{":
                out.extend(t for _, t in tokens[i + 1:nxt])
                i = _copy_braces(tokens, nxt, out, inject)
            else:
                if inject:
                    out.append("{" + inject + "}")
                i += 1
            continue
        if text == "(":
            depth_paren += 1
        elif text == ")":
            depth_paren -= 1
            if depth_paren < 0:
                raise ScopeError(f"unbalanced ')' in: {' '.join(expr.split())}")
        out.append(text)
        i += 1
    if depth_paren:
        raise ScopeError(f"unbalanced '(' in: {' '.join(expr.split())}")
    return "".join(out)


def _copy_braces(tokens: Sequence[tuple[str, str]], i: int, out: list[str], inject: str) -> int:
    """Copies the matcher list opening at ``tokens[i]`` (``{``) with ``inject`` put first;
    returns the index after its ``}``."""
    j = i + 1
    inner: list[str] = []
    while j < len(tokens) and tokens[j][1] != "}":
        inner.append(tokens[j][1])
        j += 1
    if j == len(tokens):
        raise ScopeError("unclosed '{'")
    existing = "".join(inner).strip()
    parts = [p for p in (inject, existing) if p]
    out.append("{" + ", ".join(parts) + "}")
    return j + 1


def _copy_grouping(tokens: Sequence[tuple[str, str]], i: int, out: list[str],
                   add: Sequence[str]) -> int:
    """Copies the label list opening at ``tokens[i]`` (``(``) with the labels of ``add``
    it lacks put first; returns the index after its ``)``."""
    j = i + 1
    labels: list[str] = []
    while j < len(tokens) and tokens[j][1] != ")":
        if tokens[j][0] in ("ident", "string"):
            labels.append(tokens[j][1])
        j += 1
    if j == len(tokens):
        raise ScopeError("unclosed grouping list")
    missing = [label for label in add if label not in labels]
    out.append("(" + ", ".join([*missing, *labels]) + ")")
    return j + 1


def rename_label(expr: str, old: str, new: str) -> str:
    """``expr`` with the label ``old`` called ``new``: every identifier ``old`` (in a
    matcher, a ``by``/``on``/``without`` list, the label of ``label_values(..., old)``) and
    every string that is exactly ``old`` (a label name given to ``label_replace`` or
    ``label_join``). Other strings, comments and Grafana variables are copied as they are:
    a matcher's value ``"$cluster"`` and a ``$cluster`` outside a string still name the
    dashboard's variable, which keeps its name whatever the label is called. The rules'
    label is renamed with it too (``gpuscope.alerts.render --cluster-label``)."""
    for name in (old, new):
        if not _LABEL.match(name):
            raise ScopeError(f"not a label name: {name!r}")

    def token(kind: str, text: str) -> str:
        if kind == "ident" and text == old:
            return new
        if kind == "string" and text[1:-1] == old:
            return text[0] + new + text[-1]
        return text

    return "".join(token(kind, text) for kind, text in _tokens(expr))


#: The functions that take label names as strings, and which of their arguments are label
#: names (from the index given on, for ``label_join``'s source labels).
_LABEL_ARGUMENTS: dict[str, tuple[tuple[int, ...], int | None]] = {
    "label_replace": ((1, 3), None), "label_join": ((1,), 3)}


def labels_named(expr: str) -> set[str]:
    """Every name ``expr`` reads or makes: its identifiers (labels, metric names, keywords,
    functions) and the label names it gives ``label_replace`` and ``label_join`` as
    strings (``label_join(x, "cluster_node", "/", "cluster", "node")``: ``cluster_node``,
    ``cluster``, ``node``; not the separator, replacement or regex)."""
    names: set[str] = set()
    # Per open bracket: the label-taking function it calls (else None), and the index of
    # the argument being read (a selector's braces are a bracket of their own, so the
    # commas between its matchers are not counted as arguments).
    calls: list[str | None] = []
    args: list[int] = []
    called: str | None = None
    for kind, text in _tokens(expr):
        if kind in ("space", "comment"):
            continue
        if kind == "ident":
            names.add(text)
            called = text if text in _LABEL_ARGUMENTS else None
            continue
        if text in ("(", "{"):
            calls.append(called if text == "(" else None)
            args.append(0)
        elif text in (")", "}") and calls:
            calls.pop()
            args.pop()
        elif text == "," and calls:
            args[-1] += 1
        elif kind == "string" and calls and calls[-1] is not None:
            fixed, from_on = _LABEL_ARGUMENTS[calls[-1]]
            if args[-1] in fixed or (from_on is not None and args[-1] >= from_on):
                names.add(text[1:-1])
        called = None
    return names


def count_once(expr: str, replica_labels: Sequence[str]) -> str:
    """``expr`` reading each series once where a store holds one copy of it per HA replica,
    told apart by ``replica_labels`` (two Prometheus servers that each scrape a cluster and
    evaluate the rules, writing into one store that keeps both): every instant selector
    ``x{...}`` (with its ``offset``/``@``) becomes ``max without (<labels>) (x{...})``, and
    every function call that takes a range selector, ``rate(x{...}[5m])``, becomes ``max
    without (<labels>) (rate(x{...}[5m]))``. The copies are one series before anything sums,
    counts or joins them; where a series has none of the labels, ``max`` of it alone is the
    series (its ``__name__`` dropped, as any aggregation drops it). A subquery's inner
    expression is rewritten as any other; its brackets are copied as they are."""
    labels = tuple(replica_labels)
    for name in labels:
        if not _LABEL.match(name):
            raise ScopeError(f"not a label name: {name!r}")
    if not labels:
        return expr
    head = f"max without ({', '.join(labels)}) ("
    tokens = _tokens(expr)
    out: list[str] = []
    # Per open parenthesis: where its function's name begins in ``out`` (None for a plain
    # parenthesis), and whether a range selector was read directly inside it.
    frames: list[list[Any]] = []
    call_at: int | None = None  # a function's name just written: where it begins
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind in ("space", "comment"):
            out.append(text)
            i += 1
            continue
        if kind == "other" and text == "[":
            # A subquery of a parenthesised expression: copied to its closing bracket.
            i = _copy_brackets(tokens, i, out)
            call_at = None
            continue
        if kind == "other" and text == "(":
            frames.append([call_at, False])
            out.append(text)
            call_at = None
            i += 1
            continue
        if kind == "other" and text == ")":
            if not frames:
                raise ScopeError(f"unbalanced ')' in: {' '.join(expr.split())}")
            start, ranged = frames.pop()
            out.append(text)
            if ranged and start is not None:
                out[start:] = [head + "".join(out[start:]) + ")"]
            call_at = None
            i += 1
            continue
        nxt = _next_significant(tokens, i + 1)
        follows = tokens[nxt][1] if nxt < len(tokens) else ""
        if kind == "ident" and text.lower() in _GROUPINGS and follows == "(":
            # A label list: copied as it is.
            out.extend(t for _, t in tokens[i:nxt])
            i = _copy_grouping(tokens, nxt, out, ())
            call_at = None
            continue
        if kind == "ident" and follows == "(":
            call_at = len(out)  # a function or aggregation being called
            out.append(text)
            i += 1
            continue
        if (kind == "ident" and text.lower() not in _KEYWORDS) or (kind, text) == ("other", "{"):
            i = _selector(tokens, i, out, frames, head)
            call_at = None
            continue
        out.append(text)
        call_at = None
        i += 1
    if frames:
        raise ScopeError(f"unbalanced '(' in: {' '.join(expr.split())}")
    return "".join(out)


def _copy_brackets(tokens: Sequence[tuple[str, str]], i: int, out: list[str],
                   close: str = "]") -> int:
    """Copies the brackets opening at ``tokens[i]`` (a range's or subquery's, or with
    ``close`` "}" a selector's matchers) up to ``close``; returns the index after it."""
    j = i
    while j < len(tokens) and tokens[j][1] != close:
        out.append(tokens[j][1])
        j += 1
    if j == len(tokens):
        raise ScopeError(f"unclosed {tokens[i][1]!r}")
    out.append(close)
    return j + 1


def _modifiers(tokens: Sequence[tuple[str, str]], i: int) -> int:
    """The index after the ``offset``/``@`` modifiers that begin at or after ``tokens[i]``
    (after space), or ``i`` where none does."""
    end = i
    while True:
        j = _next_significant(tokens, end)
        if j < len(tokens) and tokens[j][1].lower() == "offset":
            j = _next_significant(tokens, j + 1)
            if j < len(tokens) and tokens[j][1] == "-":
                j = _next_significant(tokens, j + 1)
            end = j + 1
        elif j < len(tokens) and tokens[j][1] == "@":
            j = _next_significant(tokens, j + 1)
            if j < len(tokens) and tokens[j][0] == "ident":  # start() or end()
                j = _next_significant(tokens, j + 1)  # (
                j = _next_significant(tokens, j + 1)  # )
            end = j + 1
        else:
            return end


def _selector(tokens: Sequence[tuple[str, str]], i: int, out: list[str],
              frames: list[list[Any]], head: str) -> int:
    """Writes the selector that begins at ``tokens[i]`` (a metric name, or ``{``) as
    :func:`count_once` reads it; returns the index after it."""
    sel: list[str] = []
    j = i
    if tokens[j][0] == "ident":
        sel.append(tokens[j][1])
        j += 1
        k = _next_significant(tokens, j)
        if k < len(tokens) and tokens[k][1] == "{":
            sel.extend(t for _, t in tokens[j:k])
            j = k
    if j < len(tokens) and tokens[j][1] == "{":
        j = _copy_brackets(tokens, j, sel, "}")
    k = _next_significant(tokens, j)
    if k < len(tokens) and tokens[k][1] == "[":
        brackets: list[str] = []
        end = _copy_brackets(tokens, k, brackets)
        if ":" not in "".join(brackets):
            # A range selector: the function that reads it is wrapped when it closes.
            if not frames or frames[-1][0] is None:
                raise ScopeError(f"a range selector outside a function call: {''.join(sel)}")
            frames[-1][1] = True
            out.extend([*sel, *(t for _, t in tokens[j:k]), *brackets])
            return end
        # A subquery of the selector: the selector is read once, then the subquery.
        out.append("(" + head + "".join(sel) + "))")
        out.extend(t for _, t in tokens[j:k])
        out.extend(brackets)
        return end
    end = _modifiers(tokens, j)
    out.append(head + "".join(sel) + "".join(t for _, t in tokens[j:end]) + ")")
    return end
