"""Fuzzing the scenario loader (``gpuscope.exporter.sources.scenario``) and ``gpuscope-exporter
--scenario``.

The documented contract: a scenario that cannot be read or is invalid raises
:class:`ScenarioError` whose text is one line naming the file and the key path (e.g.
``f.yaml: processes[3].pod: no container ...``); the CLI prints it and exits 2. So for any
text, any YAML-shaped document and any mutation of a valid scenario (a key dropped or
misspelt, a wrong type, a number out of range, huge, NaN or infinite, a negative duration,
a duplicated entry), the loader either raises ``ScenarioError`` (one line, naming the
source and, for a document, a key path that exists) or accepts it; and a scenario it accepts
must play: the simulated source, attribution and the collectors run on it without an
exception. Settings: ``tests/fuzz/_profile.py``.
"""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gpuscope.exporter.kubernetes.attribution import Attribution, attribute
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.scenario import (
    Scenario,
    ScenarioError,
    scenario_from_dict,
    scenario_from_yaml,
)
from gpuscope.exporter.sources.simulated import SimulatedSource
from gpuscope.exporter.yaml12 import Loader
from tests.conftest import REPO
from tests.fuzz._profile import fuzz
from tests.fuzz._strategies import SCALARS, yaml_like
from tests.fuzz._strategies import mutated as mutated_doc

SOURCE = "fuzz.yaml"

# docs/scenarios.md's example, the built-in scenario and a demo node: every section, every
# pattern, every fault type, MIG, replicas, anchors and merge keys.
DOCS_EXAMPLE = re.search(
    r"## Example\n\n```yaml\n(.*?)```", (REPO / "docs" / "scenarios.md").read_text(), re.S
)
assert DOCS_EXAMPLE is not None
VALID_TEXTS = {
    "docs-example": DOCS_EXAMPLE.group(1),
    "default": (REPO / "exporter" / "sources" / "scenarios" / "default.yaml").read_text(),
    "demo-p5-train": (REPO / "dashboard" / "demo" / "p5-train.yaml").read_text(),
}
# Loaded as the loader reads them (YAML 1.2: `on` is a key, not true; merges resolved).
VALID_DOCS = {name: yaml.load(text, Loader=Loader) for name, text in VALID_TEXTS.items()}

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)*"


def check_error(exc: ScenarioError, source: str = SOURCE) -> str:
    """One line that starts with the source; returns the rest."""
    text = str(exc)
    assert text and text.splitlines() == [text] and text == text.strip(), repr(text)
    assert text.startswith(f"{source}: "), text
    return text[len(source) + 2:]


def resolve_path(doc: Any, path: str) -> bool:
    """Whether the key path (``gpus[2].mig[0]``) names something in ``doc``."""
    node = doc
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            if not isinstance(node, list) or i >= len(node):
                return False
            node = node[i]
        else:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
    return True


def check_path_error(exc: ScenarioError, doc: Any) -> None:
    """A document's error names a key path whose parent exists in the document."""
    rest = check_error(exc)
    if rest.startswith("empty scenario") or rest.startswith("invalid YAML"):
        return
    if doc is not None and not isinstance(doc, dict):
        assert rest.startswith("expected a mapping"), rest
        return
    if ": unknown key" in rest:  # names the key, quoted when it is not a plain word
        assert rest.index(": unknown key") > 0, rest
        return
    m = re.match(rf"({_PATH}): ", rest)
    if m is None:  # an error of the top-level mapping itself ("missing required key")
        assert rest.startswith(("missing required key", "keys must be strings")), rest
        return
    path = m.group(1)
    parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
    assert parent == "" or resolve_path(doc, parent), (path, rest)


def play(scenario: Scenario) -> None:
    """What the exporter does with an accepted scenario: sample, attribute, render."""
    source = SimulatedSource(scenario, clock=lambda: 0.0, start=0.0)
    inputs = ScenarioInputs(scenario)
    for t in (0.0, 1.5, 359.75):
        snapshot = source.sample_at(t)
        pids = {p.pid for d in snapshot.devices for p in d.processes}
        result: Attribution = attribute(snapshot, inputs.allocations(),
                                        inputs.containers_of(pids), inputs.metadata())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuCollector(lambda s=snapshot: s, process_metrics=True))
        registry.register(ContainerCollector(lambda r=result: r))
        generate_latest(registry)


def load_or_error(doc: Any) -> Scenario | None:
    try:
        scenario = scenario_from_dict(doc, SOURCE)
    except ScenarioError as exc:
        check_path_error(exc, doc)
        return None
    play(scenario)
    return scenario


def test_the_valid_scenarios_load_and_play() -> None:
    for name, text in VALID_TEXTS.items():
        play(scenario_from_yaml(text, name))


# -- arbitrary text ----------------------------------------------------------------------------

_YAML_PIECES = st.sampled_from([
    "gpus:", "gpus: []", "gpus: [{}]", "processes:", "pods:", "faults:", "node:", "version: 1",
    "\n", "\n  ", "\n- ", "- ", ": ", "{", "}", "[", "]", ",", "&a ", "*a", "<<: *a", "!!int ",
    "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!python/object ", "? ", "'", '"',
    "#", "---", "...", "%YAML 1.2", ".nan", ".inf", "-.inf", "1e999", "9" * 400, "0x", "\t",
    "\x00", "\x85", "\ufeff", "\ud7ff", "é", "80GiB", "5m", "-5s", "1410MHz", "93%",
])
YAMLISH = st.lists(st.one_of(_YAML_PIECES, st.text(max_size=6)), max_size=30).map("".join)


@fuzz(300)
@given(text=st.one_of(st.text(), YAMLISH))
@example("version: " + "9" * 5000 + "\ngpus: []\n")  # int() refuses > 4300 digits
@example("{[1]: 2}\n")  # an unhashable key
@example("[" * 3000 + "]" * 3000)  # deeper than the recursion limit
@example("gpus: !!float abc\n")
@example("gpus: !!bool abc\n")
@example("gpus: !!timestamp abc\n")
@example("!!int")  # IndexError inside PyYAML
@example("!!float")
@example("gpus: [{count: 100000000000}]\n")  # was: minutes of validation, then the memory
def test_any_text_loads_or_fails_with_one_line(text: str) -> None:
    try:
        scenario = scenario_from_yaml(text, SOURCE)
    except ScenarioError as exc:
        check_error(exc)
    else:
        play(scenario)


# -- arbitrary documents -----------------------------------------------------------------------

KEYS = st.sampled_from([
    "version", "description", "node", "gpus", "processes", "pods", "faults", "count", "mig",
    "memory_total", "pid", "gpu", "utilization", "pattern", "steps", "every", "period", "on",
    "namespace", "name", "containers", "type", "at", "for", "code", "profile",
    "gpu_instance_id", "seed",
])
DOCS = yaml_like(KEYS)


@fuzz(300)
@given(doc=st.one_of(DOCS, st.dictionaries(KEYS, DOCS, max_size=6)))
@example({"version": 10**5000, "gpus": []})  # str() refuses > 4300 digits
@example({"gpus": [{"power_limit": 10**400}]})  # float() overflows
@example({"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "memory": 10**400}]})
@example({"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "start": 10**400}]})
@example({"gpus": [{"memory_clock": "9" * 400 + "Hz"}]})  # an infinite frequency
@example({"gpus": [{"memory_total": "9" * 400 + "GiB"}]})  # round(inf)
@example({"gpus": [{"memory_total": 10**400}]})  # accepted, then float() overflowed
@example({"gpus": [{"ecc": {"corrected": 10**400}}]})  # accepted, then float() overflowed
@example({"gpus": [{}], "processes": [{"pid": 1, "gpu": "9" * 5000}]})
@example({"gpus": [{"mig": [{"profile": "1g." + "9" * 5000 + "gb", "gpu_instance_id": 1}]}]})
@example({"gpus": [{}], "faults": [{"type": "xid", "gpu": 0, "code": 1, "every": 5e-324}]})
@example({"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "utilization": {
    "pattern": "random", "low": 0, "high": 1, "interval": 5e-324}}]})
@example({"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "utilization": {
    "pattern": "sine", "low": 0, "high": 1, "period": 1, "phase": 1.7e308}}]})
@example({"gpus": [{}], "pods": [{"namespace": "ml\n", "name": "p",
                                  "containers": [{"name": "c"}]}]})
def test_any_document_loads_or_fails_with_one_line_naming_a_path(doc: Any) -> None:
    load_or_error(doc)


@fuzz(100)
@given(doc=st.dictionaries(KEYS, DOCS, max_size=6))
def test_any_document_as_yaml_loads_or_fails_with_one_line(doc: Any) -> None:
    text = yaml.safe_dump(doc)
    try:
        scenario = scenario_from_yaml(text, SOURCE)
    except ScenarioError as exc:
        check_error(exc)
    else:
        play(scenario)


# -- mutations of valid scenarios --------------------------------------------------------------


BAD_VALUES = st.one_of(
    SCALARS,
    st.sampled_from([
        -1, -5, 0, 1, 10**12, 2**64, 10**400, -(10**400), math.nan, math.inf, -math.inf,
        1e308, 5e-324, -1e-9, "-1s", "-5m", "0s", "1e3s", "NaN", "inf", "-80GiB", "1e400GiB",
        "9" * 400 + "MHz", "150%", "-3%", "9999999999999", "99/99", "0::99999", "x/y/z",
        "ml//c", [], {}, [[]], [None], {"pattern": "nope"}, {"pattern": "stepped", "steps": []},
    ]),
    DOCS,
)


def mutated() -> st.SearchStrategy[Any]:
    return mutated_doc([VALID_DOCS[name] for name in sorted(VALID_DOCS)], BAD_VALUES, KEYS)


@fuzz(250)
@given(doc=mutated())
def test_mutated_scenarios_load_and_play_or_fail_with_one_line_naming_a_path(doc: Any) -> None:
    load_or_error(doc)


@fuzz(60)
@given(doc=mutated())
def test_mutated_scenario_files_load_or_fail_with_one_line(doc: Any) -> None:
    # Through YAML text and load_scenario's file path.
    buf = io.StringIO()
    yaml.safe_dump(doc, buf)
    try:
        scenario = scenario_from_yaml(buf.getvalue(), SOURCE)
    except ScenarioError as exc:
        check_error(exc)
    else:
        play(scenario)


# -- the CLI -----------------------------------------------------------------------------------

# A few files of each kind of mistake, run through the real command; each must end in exit
# code 2 and one "gpuscope-exporter: error: <file>: ..." line.
BASE = VALID_TEXTS["docs-example"]
CLI_CASES = {
    "wrong-type": BASE.replace("gpus:\n  - count: 2", "gpus:\n  - count: two"),
    "huge-number": BASE.replace("power_idle: 55", "power_idle: " + "9" * 400),
    "nan": BASE.replace("power_idle: 55", "power_idle: .nan"),
    "negative-duration": BASE.replace("start: 60", "start: -60s"),
    "missing-pod": BASE.replace("pod: research/jupyter-carol/notebook",
                                "pod: research/jupyter-carol/notebok"),
    "huge-int-digits": BASE.replace("seed: 7", "seed: " + "7" * 5000),
    "deep": "gpus: " + "[" * 3000 + "]" * 3000 + "\n",
    # libyaml's composer recursed in C until the process died of SIGSEGV.
    "deeper": "gpus: " + "[" * 100_000 + "]" * 100_000 + "\n",
}
CLI_EXPECT = {
    "wrong-type": "gpus[0].count: expected an integer",
    "huge-number": "gpus[0].power_idle:",
    "nan": "gpus[0].power_idle: expected a finite number",
    "negative-duration": "processes[2].start: expected seconds",
    "missing-pod": "processes[2].pod: no container research/jupyter-carol/notebok",
    "huge-int-digits": "invalid YAML",
    "deep": "invalid YAML",
    "deeper": "invalid YAML: nested too deeply",
}


def test_cli_exits_2_with_one_line_for_bad_scenario_files(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    procs = {}
    for name, text in CLI_CASES.items():
        assert text != BASE, name
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        procs[name] = (path, subprocess.Popen(
            [sys.executable, "-m", "gpuscope.exporter",
             "--source", "simulated", "--scenario", str(path),
             "--listen", "127.0.0.1:0"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    for name, (path, proc) in procs.items():
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{name}: still running: the bad file was accepted")
        assert proc.returncode == 2, (name, err)
        assert "Traceback" not in err and out == ""
        lines = err.splitlines()
        assert len(lines) == 1, (name, err)
        assert lines[0].startswith(f"gpuscope-exporter: error: {path}: "), lines[0]
        assert CLI_EXPECT[name] in lines[0], lines[0]
