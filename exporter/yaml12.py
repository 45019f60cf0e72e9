"""YAML as the programs read their files (a scenario, a price table, a rule file): YAML 1.2
scalars (only true/false are booleans, ``1e1`` is a number, no sexagesimal numbers, a date is
text), duplicate keys and deep nesting refused, and any failure one line naming the file and
where in it (:class:`YamlError`)."""

from __future__ import annotations

import re

import yaml


class YamlError(ValueError):
    """Text that is not YAML the programs read; ``str()`` is one line naming the source."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"
# YAML 1.1 alone: a date (``2024-01-01``) and ``=`` are text in YAML 1.2 (and to Go's yaml).
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_VALUE = "tag:yaml.org,2002:value"


# libyaml's parser when PyYAML was built with it (the wheels are): a 10,000-process
# scenario parses in about a second instead of ten. Resolvers and constructors stay Python.
_SafeBase = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class Loader(_SafeBase):  # type: ignore[misc,valid-type]
    """SafeLoader with YAML 1.2 scalars (only true/false are booleans, so a key named ``on``
    stays a string; no sexagesimal numbers, dates or ``=`` values) that rejects duplicate
    keys."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in (_BOOL, _INT, _FLOAT, _TIMESTAMP, _VALUE)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_mapping_no_duplicates(
    loader: Loader, node: yaml.MappingNode
) -> dict[object, object]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE:
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            # A list or mapping as a key: unhashable (dict() would raise TypeError).
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a scalar, not a list or mapping",
                key_node.start_mark,
            )
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


Loader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_duplicates
)


def _yaml_error_line(source: str, exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in problem:
            # PyYAML >= 6.0.4 has a depth limit of its own: the same words as ours, whichever
            # of the two catches a file first.
            problem = "nested too deeply"
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return f"{source}: {where}invalid YAML: {problem}"
    return f"{source}: invalid YAML: {exc}"


# A scenario nests about 8 levels, a price table 4. libyaml's composer (the CSafeLoader
# base) recurses in C: some ten thousand levels of "[[[[..." overflow the stack and kill
# the process.
_MAX_DEPTH = 1000


def _too_deep(text: str) -> bool:
    """Whether ``text`` nests YAML collections more than ``_MAX_DEPTH`` levels deep.

    A cheap bound first, enough for every ordinary file: each flow collection needs a bracket,
    and nested block collections need a greater column (at most two levels per column), so
    the depth is at most brackets + 2 x (longest line + 1). Past it, count exactly on
    libyaml's event stream, which is iterative."""
    longest = max(map(len, text.splitlines()), default=0)
    if text.count("[") + text.count("{") + 2 * (longest + 1) <= _MAX_DEPTH:
        return False
    depth = 0
    try:
        for event in yaml.parse(text, Loader=Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > _MAX_DEPTH:
                    return True
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return False  # the real load reports it, with its position
    return False


def _show_error(exc: Exception) -> str:
    text = str(exc)
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load(text: str, source: str) -> object:
    """The document of ``text`` (:class:`Loader`); ``source`` names it in the one line of
    :class:`YamlError` that anything unreadable raises."""
    if _too_deep(text):
        raise YamlError(f"{source}: invalid YAML: nested too deeply")
    try:
        return yaml.load(text, Loader=Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise YamlError(_yaml_error_line(source, exc)) from None
    except RecursionError:
        raise YamlError(f"{source}: invalid YAML: nested too deeply") from None
    except Exception as exc:  # whatever PyYAML raises, the text is not valid YAML
        # PyYAML's constructors raise ValueError, KeyError, IndexError, AttributeError ...
        # for some bad scalars: an integer of more than 4300 digits, '!!float x', '!!int',
        # '!!bool x', '!!timestamp x'.
        raise YamlError(f"{source}: invalid YAML: {_show_error(exc)}") from None
