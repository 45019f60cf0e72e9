"""gpuscope exporter: NVML (or simulated) GPU metrics for Prometheus and CloudWatch."""


def __getattr__(name: str) -> str:
    # ``__version__`` on demand: the installed distribution's version (one source of truth,
    # pyproject.toml), looked up only by what needs it (User-Agent headers).
    if name == "__version__":
        from gpuscope.exporter.flags import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
