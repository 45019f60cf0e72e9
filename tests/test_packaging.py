"""The installed layout: every folder of Python code is installed, under the one ``gpuscope``
namespace, and no generic top-level name (``exporter``, ``dashboard``, ``alerts``) is claimed."""

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _tree_packages() -> set[str]:
    found = set()
    for namespaced, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        for root, dirs, files in os.walk(REPO / folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                rel = Path(root).relative_to(REPO / folder)
                found.add(".".join((namespaced, *rel.parts)))
    return found


def test_every_package_folder_is_listed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert listed == _tree_packages(), (
        "pyproject.toml [tool.setuptools] packages is out of step with the tree")


def test_wheel_installs_only_the_gpuscope_namespace(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True,
                   cwd=tmp_path, timeout=300)
    (wheel,) = tmp_path.glob("gpuscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gpuscope"}
    for data in ("gpuscope/exporter/sources/scenarios/default.yaml",
                 "gpuscope/dashboard/prices.yaml", "gpuscope/alerts/gpuscope-rules.yaml",
                 # The page's assets: its style, and its tables' keyboard sorting.
                 "gpuscope/dashboard/assets/style.css",
                 "gpuscope/dashboard/assets/table_sort.js"):
        assert data in names
    entry = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("gpuscope-exporter = gpuscope.exporter.cli:main",
                   "gpuscope-dashboard = gpuscope.dashboard.cli:main",
                   "gpuscope-alarms = gpuscope.alerts.alarms:main"):
        assert script in entry
