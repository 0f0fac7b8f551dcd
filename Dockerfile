# syntax=docker/dockerfile:1
# One image for every gitward process; the command picks the role:
#   up                      the whole system (embedded Redis when REDIS_URLS is unset)
#   up --workers 0          the web process alone (the default command)
#   worker --workers N      N RQ worker processes (one host's worth)
# Multi-stage: wheels are built in `build`; the runtime has no build tools and runs as an
# unprivileged user. `make deploy-check` runs hadolint on this file.
# The dependencies are exactly requirements/image.txt (the runtime and otel part of the lock,
# every file's hash checked: docs/testing.md#the-lock-file); gitward's own wheel adds none.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY requirements/image.txt ./requirements/
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements/image.txt
COPY pyproject.toml ./
COPY dashboard ./dashboard
COPY workers ./workers
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm AS runtime
# Debian's packages are pinned by the base image's release, not per package: a pinned
# version vanishes from the mirror at the next point release and breaks the build.
# git runs the analysis; redis-server serves `up`'s embedded nodes; tini is PID 1.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client ca-certificates redis-server tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 gitward \
 && useradd --create-home --uid 10001 --gid 10001 gitward
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY --chown=gitward:gitward manage.py ./
COPY --chown=gitward:gitward dashboard ./dashboard
COPY --chown=gitward:gitward workers ./workers
COPY --chown=gitward:gitward templates ./templates
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GITWARD_VAR_DIR=/var/lib/gitward \
    GITWARD_WORKSPACE=/var/lib/gitward/workspace \
    GITWARD_STATIC_ROOT=/app/static \
    HOST=0.0.0.0 \
    PORT=8000
# Static files are collected once, at build time, into the image (WhiteNoise serves them).
# The key is a throw-away: collectstatic signs nothing.
RUN mkdir -p /var/lib/gitward/workspace /app/static \
 && GITWARD_SECRET_KEY=build-only python manage.py collectstatic --noinput --verbosity 0 \
 && chown -R gitward:gitward /var/lib/gitward /app/static
# The workspace (git mirrors) belongs to one host: every container gets its own
# anonymous volume here unless the orchestrator mounts a per-replica one
# (docs/configuration.md).
VOLUME ["/var/lib/gitward/workspace"]
USER 10001:10001
EXPOSE 8000
# Readiness, not liveness: GET /readyz (database migrated, a majority of lock masters and
# the queue Redis answering; 503 with a JSON body naming what failed). The image's default
# command is the web process; worker containers, which serve no HTTP, override this with
# `manage.py ready` (the same checks, dashboard/operations/readiness.py): see compose.yaml. The
# X-Forwarded-Proto header spares the probe GITWARD_PRODUCTION's HTTPS redirect.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen(u.Request(f\"http://127.0.0.1:{os.environ.get('PORT', '8000')}/readyz\", headers={'X-Forwarded-Proto': 'https'}), timeout=5)"]
# tini forwards SIGTERM to manage.py alone (no -g): `up` and `worker` pass it on to their
# workers once each, so RQ does a warm shutdown (finish the job) rather than a cold one.
ENTRYPOINT ["tini", "--", "python", "manage.py"]
CMD ["up", "--workers", "0"]
