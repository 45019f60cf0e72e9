# syntax=docker/dockerfile:1
#
# gpuscope images. Two targets, one Dockerfile (docs/deploy.md#images):
#   docker build -t gpuscope-exporter:0.1.0 .                      # the exporter (default, last stage)
#   docker build -t gpuscope-dashboard:0.1.0 --target dashboard .  # the dashboard
#
# What gets installed is exactly what pyproject.toml declares: the build stage resolves the
# gpuscope wheel's own metadata ([project].dependencies, plus the named extra for the
# dashboard), and the final stages install with --no-index from that wheel directory only, so
# nothing undeclared can slip in (tests/deploy/test_dockerfile.py checks this file against
# pyproject.toml). Test extras are never installed.
#
# EXPORTER_EXTRAS: optional pyproject extras for the exporter image, comma-separated (e.g. the
# CloudWatch client, if pyproject declares it as an extra). Empty by default.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Fixed non-root UID/GID of the images, matching the manifests (deploy/base/dashboard.yaml,
# deploy/components/non-root). 65532 is the conventional "nonroot" ID of distroless images.
ARG APP_UID=65532

# ---- wheel: gpuscope itself, built from the source tree ----------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter/ exporter/
COPY dashboard/ dashboard/
COPY alerts/ alerts/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --no-deps --wheel-dir /wheels/self .

# ---- deps-*: wheels of exactly what the gpuscope wheel's metadata requires ---------------------
# The requirement names the local wheel file, never an index: a "gpuscope" on PyPI can not be
# picked up instead. Only the stages a target needs are built (BuildKit).
FROM wheel AS deps-exporter
ARG EXPORTER_EXTRAS=""
RUN --mount=type=cache,target=/root/.cache/pip \
    whl="$(echo /wheels/self/gpuscope-*.whl)" \
 && pip wheel --wheel-dir /wheels/exporter "gpuscope${EXPORTER_EXTRAS:+[${EXPORTER_EXTRAS}]} @ file://${whl}"

FROM wheel AS deps-dashboard
RUN --mount=type=cache,target=/root/.cache/pip \
    whl="$(echo /wheels/self/gpuscope-*.whl)" \
 && pip wheel --wheel-dir /wheels/dashboard "gpuscope[dashboard] @ file://${whl}"

# ---- common runtime base ----------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG APP_UID
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# A fixed unprivileged user; no setuid/setgid binaries left in the image (su, mount, passwd...),
# so nothing in it can raise privileges even where a pod allows privilege escalation.
RUN groupadd --system --gid "${APP_UID}" gpuscope \
 && useradd --system --uid "${APP_UID}" --gid "${APP_UID}" --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin gpuscope \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
WORKDIR /

# ---- dashboard: gpuscope[dashboard] -------------------------------------------------------------
FROM runtime AS dashboard
RUN --mount=type=bind,from=deps-dashboard,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels/dashboard "gpuscope[dashboard]" \
 && pip uninstall --yes pip setuptools wheel
USER ${APP_UID}:${APP_UID}
EXPOSE 8050
ENTRYPOINT ["gpuscope-dashboard"]
CMD ["--listen", "0.0.0.0:8050"]

# ---- exporter (default target): gpuscope with its runtime dependencies only --------------------
FROM runtime AS exporter
ARG EXPORTER_EXTRAS=""
RUN --mount=type=bind,from=deps-exporter,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels/exporter "gpuscope${EXPORTER_EXTRAS:+[${EXPORTER_EXTRAS}]}" \
 && pip uninstall --yes pip setuptools wheel \
 && python -m compileall -q -j 0 -o 2 /usr/local/lib/python3.11
# How the exporter's interpreter runs (bench/exporter_bench.py --as-image measures it so, and
# docs/benchmarks.md has the figures; tests/deploy/test_dockerfile.py keeps the two equal):
# - PYTHONOPTIMIZE=2 (python -OO): no docstrings and no `assert` statements in memory, loaded
#   from the level-2 bytecode compiled just above for the standard library and site-packages
#   under it (the libraries and gpuscope) (without it the interpreter would compile every module from source at each
#   start: PYTHONDONTWRITEBYTECODE). -2.7 MiB of the 48 the exporter held on an 8-GPU node
#   with the kubelet and API-server clients on. Nothing the exporter runs reads docstrings;
#   its `assert`s only narrow types for mypy.
# - MALLOC_ARENA_MAX=2: the exporter's nine threads share two glibc malloc arenas instead of
#   taking one each (-0.5 MiB; its threads allocate little, so contention is not a concern).
ENV PYTHONOPTIMIZE=2 MALLOC_ARENA_MAX=2
# The DaemonSet runs this image as UID 0 with every capability dropped (the kubelet's
# pod-resources socket is root-only); anywhere else it runs as this unprivileged user.
USER ${APP_UID}:${APP_UID}
EXPOSE 9463
ENTRYPOINT ["gpuscope-exporter"]
