"""Reading scenario files (YAML as :mod:`gpuscope.exporter.yaml12` reads it: duplicate keys
and deep nesting refused), the built-in scenario, and one-line errors for anything that
cannot be read."""

from __future__ import annotations

import importlib.resources
import os

from gpuscope.exporter.files import TooLarge, read_text
from gpuscope.exporter.sources.scenario.model import Scenario, ScenarioError, one_line
from gpuscope.exporter.sources.scenario.parse import scenario_from_dict
from gpuscope.exporter.yaml12 import YamlError, load

#: How the built-in scenario is named in error messages and logs.
DEFAULT_SCENARIO_NAME = "exporter/sources/scenarios/default.yaml"


def scenario_from_yaml(text: str, source: str = "<scenario>") -> Scenario:
    """Parse and validate scenario YAML ``text``; ``source`` names it in error messages."""
    try:
        data = load(text, source)
    except YamlError as exc:
        raise ScenarioError(str(exc)) from None
    return scenario_from_dict(data, source)


#: The largest scenario file read, in bytes (the largest allowed, 1,024 GPUs with their
#: processes, is well under a MiB).
MAX_SCENARIO_BYTES = 16 << 20


def load_scenario(path: str | os.PathLike[str] | None = None) -> Scenario:
    """Load and validate the scenario file at ``path``; ``None`` loads the built-in default.

    Raises :class:`ScenarioError` (one line) when the file cannot be read or is invalid.
    """
    if path is None:
        return load_default_scenario()
    source = os.fspath(path)
    try:
        text = read_text(path, MAX_SCENARIO_BYTES)
    except TooLarge as exc:
        raise ScenarioError(one_line(f"{source}: {exc}")) from None
    except UnicodeDecodeError:
        raise ScenarioError(one_line(f"{source}: cannot read: not UTF-8 text")) from None
    except OSError as exc:
        raise ScenarioError(one_line(f"{source}: cannot read: {exc.strerror or exc}")) from None
    except ValueError as exc:  # e.g. "embedded null byte" in the path
        raise ScenarioError(one_line(f"{source!r}: cannot read: {exc}")) from None
    return scenario_from_yaml(text, source)


def load_default_scenario() -> Scenario:
    """The built-in scenario shipped as ``exporter/sources/scenarios/default.yaml``."""
    res = importlib.resources.files("gpuscope.exporter.sources").joinpath("scenarios/default.yaml")
    return scenario_from_yaml(res.read_text(encoding="utf-8"), DEFAULT_SCENARIO_NAME)
