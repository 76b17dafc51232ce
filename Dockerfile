# syntax=docker/dockerfile:1
# qtts on CPU (docs/container.md).
#   docker build -t qtts .                     runtime: `qtts serve` / `qtts wyoming` on an ONNX plan,
#                                              core + serve + wyoming extras, no torch
#   docker build --target plan -t qtts-plan .  + torch and the export extra: builds the int8 ONNX plan
#                                              of /models/M into the /cache volume (once)
# compose.yaml wires both. Build args:
#   BASE         the Python base image (any Debian-like image with python3 -m venv)
#   WHEELS       a folder of the build context holding every wheel (offline/air-gapped builds:
#                pip runs with --no-index --find-links); empty (default): pip uses the package index
#   TORCH        the torch requirement of the plan target; TORCH_INDEX where it comes from (CPU wheels)
ARG BASE=python:3.12-slim

# -- the virtual environment of the runtime: core + serve + wyoming (no torch) ------------------------
FROM ${BASE} AS venv
ARG WHEELS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/qtts
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN --mount=type=bind,source=.,target=/ctx \
    set -e; if [ -n "$WHEELS" ]; then set -- --no-index --find-links "/ctx/$WHEELS"; fi; \
    /opt/qtts/bin/pip install "$@" ".[serve,wyoming]"

# -- the runtime's copy: no pip or setuptools (nothing installs at run time) ---------------------------
FROM venv AS venv-slim
RUN /opt/qtts/bin/python -m pip uninstall -q -y pip setuptools

# -- the plan builder's environment: the runtime's + torch (CPU) + onnx (extra export) -----------------
FROM venv AS plan-venv
ARG WHEELS=""
ARG TORCH=torch
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN --mount=type=bind,source=.,target=/ctx \
    set -e; if [ -n "$WHEELS" ]; then set -- --no-index --find-links "/ctx/$WHEELS"; \
    else set -- --index-url "$TORCH_INDEX"; fi; \
    /opt/qtts/bin/pip install "$@" "$TORCH"; \
    if [ -n "$WHEELS" ]; then set -- --no-index --find-links "/ctx/$WHEELS"; else set --; fi; \
    /opt/qtts/bin/pip install "$@" ".[export]"

# -- what both final images share: a non-root user, the cache and voices folders ---------------------
FROM ${BASE} AS common
RUN useradd --create-home --uid 1000 --user-group qtts \
    && mkdir -p /cache /voices /models \
    && chown qtts:qtts /cache /voices
ENV PATH=/opt/qtts/bin:$PATH QTTS_CACHE=/cache PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/qtts

# -- target `plan`: one-shot, builds $QTTS_CACHE/<model>-int8 from /models/<model> if missing --------
FROM common AS plan
COPY --from=plan-venv /opt/qtts /opt/qtts
COPY container/plan.sh /usr/local/bin/qtts-plan
VOLUME ["/cache"]
USER qtts
ENTRYPOINT ["/bin/sh", "/usr/local/bin/qtts-plan"]

# -- default target: the runtime (last stage) --------------------------------------------------------
FROM common AS runtime
COPY --from=venv-slim /opt/qtts /opt/qtts
VOLUME ["/cache", "/voices"]
USER qtts
EXPOSE 8000 10200
ENTRYPOINT ["qtts"]
CMD ["--help"]
