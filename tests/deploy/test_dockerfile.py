"""The Dockerfile installs exactly what pyproject.toml declares, and matches the manifests.

No Docker engine is available to build it, so this reads the Dockerfile: stages, build args,
every pip command. The only thing any stage may install is the gpuscope wheel built from this
tree, with the extras its target is meant to have (none for the exporter, `dashboard` for the
dashboard): pip then installs the wheel's declared dependencies -- [project].dependencies and
those extras -- from a wheel directory with --no-index, so nothing else can get in.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.render import REPO, exporter_container, one, render

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# pip options that take a value (the value is not a requirement).
_VALUE_OPTIONS = {"--wheel-dir", "-w", "--find-links", "-f", "--target", "-t", "--prefix", "--root"}
_FORBIDDEN_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable",
                      "-i", "--index-url", "--extra-index-url", "--pre", "--user"}
# gpuscope, optionally with extras, optionally pinned to the wheel file built in the `wheel`
# stage (`whl` is set from /wheels/self/gpuscope-*.whl in the same RUN).
_REQUIREMENT = re.compile(
    r"gpuscope(?:\[(?P<extras>[a-z0-9_,-]*)\])?(?: @ file://(?:/wheels/self/\S+\.whl|\$\{whl\}))?")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def _parse() -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order). Joins continuation lines, drops comments."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), re.IGNORECASE)
            assert m, f"every stage is named: {line}"
            stages.append(Stage(name=m.group(2), base=m.group(1)))
        elif not stages:
            assert keyword == "ARG", f"only ARG before the first FROM: {line}"
            name, _, default = rest.strip().partition("=")
            global_args[name] = default.strip('"')
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return global_args, stages


GLOBAL_ARGS, STAGES = _parse()
BY_NAME = {s.name: s for s in STAGES}


def _args(stage: Stage) -> dict[str, str]:
    """Build-arg defaults visible in a stage (global ARGs must be re-declared, as in Docker)."""
    values: dict[str, str] = {}
    chain = [stage]
    while chain[-1].base in BY_NAME:
        chain.append(BY_NAME[chain[-1].base])
    for s in reversed(chain):
        for declared in s.all("ARG"):
            name, eq, default = declared.partition("=")
            values[name] = default.strip('"') if eq else GLOBAL_ARGS.get(name, "")
    return values


def _expand(text: str, args: dict[str, str]) -> str:
    """The shell expansions the Dockerfile uses: ${VAR:+word} and ${VAR}, with default args."""
    def plus(m: re.Match[str]) -> str:
        return _expand(m.group(2), args) if args.get(m.group(1)) else ""
    text = re.sub(r"\$\{(\w+):\+((?:[^{}]|\{[^{}]*\})*)\}", plus, text)
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


@dataclass
class Pip:
    stage: str
    command: str  # install / wheel / uninstall
    options: list[str]
    requirements: list[str]


def _pip_commands() -> list[Pip]:
    found = []
    for stage in STAGES:
        args = _args(stage)
        for run in stage.all("RUN"):
            run = re.sub(r"^(--mount=\S+\s+)+", "", run)
            for command in re.split(r"&&|;", run):
                words = shlex.split(_expand(command, args))
                if "pip" not in words:
                    continue
                rest = words[words.index("pip") + 1:]
                options, requirements, skip = [], [], False
                for word in rest[1:]:
                    if skip:
                        skip = False
                        continue
                    if word.startswith("-"):
                        options.append(word)
                        skip = word in _VALUE_OPTIONS
                    else:
                        requirements.append(word)
                found.append(Pip(stage.name, rest[0], options, requirements))
    return found


PIP = _pip_commands()


def test_stages_and_default_target() -> None:
    assert [s.name for s in STAGES] == [
        "wheel", "deps-exporter", "deps-dashboard", "runtime", "dashboard", "exporter"]
    # `docker build .` with no --target builds the last stage: the exporter.
    assert STAGES[-1].name == "exporter"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", GLOBAL_ARGS["PYTHON_IMAGE"])
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    for stage in STAGES:
        assert stage.base in BY_NAME or stage.base == "${PYTHON_IMAGE}", stage


def test_only_the_gpuscope_wheel_is_ever_installed() -> None:
    assert PIP, "no pip command found"
    for pip in PIP:
        assert not set(pip.options) & _FORBIDDEN_OPTIONS, pip
        if pip.command == "uninstall":
            assert set(pip.requirements) <= {"pip", "setuptools", "wheel"}, pip
            continue
        assert pip.command in ("install", "wheel"), pip
        for req in pip.requirements:
            assert req == "." or _REQUIREMENT.fullmatch(req), f"undeclared package {req!r}: {pip}"
    # The gpuscope wheel itself, from this tree, without dependencies.
    (own,) = [p for p in PIP if p.requirements == ["."]]
    assert own.command == "wheel" and "--no-deps" in own.options
    # The dependency wheels come from the wheel built here, never from an index by name.
    for pip in PIP:
        if pip.stage.startswith("deps-"):
            assert all(" @ file://" in r for r in pip.requirements), pip
    for stage in ("deps-exporter", "deps-dashboard"):
        (run,) = BY_NAME[stage].all("RUN")
        assert 'whl="$(echo /wheels/self/gpuscope-*.whl)"' in run
    # Final installs never reach an index.
    for pip in PIP:
        if pip.command == "install":
            assert "--no-index" in pip.options, pip


def test_no_system_packages_installed() -> None:
    for stage in STAGES:
        for run in stage.all("RUN"):
            assert not re.search(r"\b(apt-get|apt|apk|dnf|yum)\s+install\b", run), run


def _extras(stage: str, command: str) -> set[str]:
    (pip,) = [p for p in PIP if p.stage == stage and p.command == command]
    (req,) = pip.requirements
    m = _REQUIREMENT.fullmatch(req)
    assert m, req
    return {e for e in (m.group("extras") or "").split(",") if e}


def _effective_dependencies(extras: set[str]) -> list[str]:
    optional = PYPROJECT["project"].get("optional-dependencies", {})
    deps = list(PYPROJECT["project"]["dependencies"])
    for extra in sorted(extras):
        assert extra in optional, f"extra [{extra}] is not declared in pyproject.toml"
        deps += optional[extra]
    return deps


def test_exporter_image_gets_exactly_the_runtime_dependencies() -> None:
    extras = _extras("exporter", "install")
    assert extras == set(), "default build: no extras, only [project].dependencies"
    assert _extras("deps-exporter", "wheel") == extras
    assert _effective_dependencies(extras) == PYPROJECT["project"]["dependencies"]
    (mount,) = [r for r in BY_NAME["exporter"].all("RUN") if "pip install" in r]
    assert "from=deps-exporter" in mount


def test_dashboard_image_gets_the_dashboard_extra() -> None:
    extras = _extras("dashboard", "install")
    assert extras == {"dashboard"}
    assert _extras("deps-dashboard", "wheel") == extras
    deps = _effective_dependencies(extras)
    assert deps[: len(PYPROJECT["project"]["dependencies"])] == PYPROJECT["project"]["dependencies"]
    (mount,) = [r for r in BY_NAME["dashboard"].all("RUN") if "pip install" in r]
    assert "from=deps-dashboard" in mount


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_test_dependencies_never_reach_an_image() -> None:
    optional = PYPROJECT["project"].get("optional-dependencies", {})
    runtime = {_name(d) for d in PYPROJECT["project"]["dependencies"]}
    test_only = {_name(d) for d in optional.get("test", [])} - runtime
    assert {"pytest", "ruff", "mypy"} <= test_only
    for target in ("exporter", "dashboard"):
        extras = _extras(target, "install")
        assert "test" not in extras
        installed = {_name(d) for d in PYPROJECT["project"]["dependencies"]}
        installed |= {_name(d) for e in extras for d in optional.get(e, [])}
        assert not installed & test_only, (target, installed & test_only)


@pytest.mark.parametrize(("target", "script"),
                         [("exporter", "gpuscope-exporter"), ("dashboard", "gpuscope-dashboard")])
def test_entrypoints_are_declared_scripts(target: str, script: str) -> None:
    (entrypoint,) = BY_NAME[target].all("ENTRYPOINT")
    assert entrypoint == f'["{script}"]'
    assert script in PYPROJECT["project"].get("scripts", {}), f"[project.scripts] lacks {script}"


def test_user_ids_and_ports_match_the_manifests() -> None:
    uid = int(GLOBAL_ARGS["APP_UID"])
    objs = render("eks")
    dashboard_pod = one(objs, "Deployment", "gpuscope-dashboard")["spec"]["template"]["spec"]
    assert dashboard_pod["securityContext"]["runAsUser"] == uid
    nonroot = one(render("gke-podmonitor-nonroot"), "DaemonSet", "gpuscope-exporter")
    assert nonroot["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid
    for target in ("exporter", "dashboard"):
        (user,) = BY_NAME[target].all("USER")
        # Numeric, so that the kubelet can verify runAsNonRoot.
        assert _expand(user, {"APP_UID": str(uid)}) == f"{uid}:{uid}"
    assert BY_NAME["exporter"].all("EXPOSE") == [
        str(p["containerPort"]) for p in exporter_container(objs)["ports"]]
    assert BY_NAME["dashboard"].all("EXPOSE") == [
        str(p["containerPort"]) for p in dashboard_pod["containers"][0]["ports"]]


def test_build_context_holds_what_the_build_copies() -> None:
    allow = [line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
             if line.startswith("!")]
    lines = DOCKERIGNORE.read_text().splitlines()
    assert "*" in lines, ".dockerignore is an allowlist"
    copied = []
    for stage in STAGES:
        for copy in stage.all("COPY"):
            if "--from" in copy:
                continue
            *sources, _dest = shlex.split(copy)
            copied += [s.rstrip("/") for s in sources]
    assert sorted(copied) == sorted(allow)
    assert PYPROJECT["project"]["readme"] in copied
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    assert set(folders) <= set(copied)
    for path in copied:
        assert (REPO / path).exists(), path


def test_no_secrets_or_tests_in_the_context() -> None:
    allow = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
             if line.startswith("!")}
    assert not allow & {"tests", ".git", ".venv", "bench", "deploy", "docs", ".ci", "scripts"}
    assert Path(REPO / "tests").is_dir()


def test_exporter_runs_as_the_benchmark_measures_it() -> None:
    """The exporter stage sets the environment ``bench/exporter_bench.py --as-image`` gives the
    exporter (the memory budget is measured so), and compiles the standard library and the
    installed packages at the optimization level that environment asks for: an optimizing
    interpreter with no bytecode of its level compiles every module from source."""
    from bench.exporter_bench import IMAGE_ENV

    stage = BY_NAME["exporter"]
    env: dict[str, str] = {}
    for arg in stage.all("ENV"):
        for pair in shlex.split(arg):
            key, _, value = pair.partition("=")
            env[key] = value
    assert {k: env.get(k) for k in IMAGE_ENV} == IMAGE_ENV
    level = IMAGE_ENV["PYTHONOPTIMIZE"]
    compiles = [run for run in stage.all("RUN") if "compileall" in run]
    assert compiles, "the exporter stage does not byte-compile anything"
    (run,) = compiles
    # The base image's standard library, site-packages inside it.
    version = re.fullmatch(r"python:(3\.\d+)-slim(-\w+)?", GLOBAL_ARGS["PYTHON_IMAGE"])
    assert version, GLOBAL_ARGS["PYTHON_IMAGE"]
    assert re.search(rf"python -m compileall (-\w+ \w+ |-q )*-o {level} "
                     rf"/usr/local/lib/python{re.escape(version.group(1))}$", run), run
    # ...after everything is installed, so nothing is left to compile at start-up.
    runs = stage.all("RUN")
    assert runs.index(run) == len(runs) - 1
