"""Scenario files for the simulated GPU source (see :mod:`.parse`)."""

from gpuscope.exporter.sources.scenario.parse import *  # noqa: F403
from gpuscope.exporter.sources.scenario.parse import __all__ as __all__
from gpuscope.exporter.sources.scenario.parse import _Loader as _Loader
