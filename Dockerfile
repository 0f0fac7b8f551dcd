# syntax=docker/dockerfile:1
# One image for the web process and the workers (different commands).

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip
COPY pyproject.toml ./
COPY dashboard ./dashboard
COPY workers ./workers
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client ca-certificates redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 gitward
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/* && rm -rf /wheels
WORKDIR /app
COPY --chown=gitward:gitward manage.py ./
COPY --chown=gitward:gitward dashboard ./dashboard
COPY --chown=gitward:gitward workers ./workers
COPY --chown=gitward:gitward templates ./templates
ENV PYTHONUNBUFFERED=1 \
    GITWARD_VAR_DIR=/var/lib/gitward \
    GITWARD_WORKSPACE=/var/lib/gitward/workspace \
    GITWARD_STATIC_ROOT=/app/static \
    HOST=0.0.0.0 \
    PORT=8000
RUN mkdir -p /var/lib/gitward /app/static \
 && GITWARD_SECRET_KEY=build-only python manage.py collectstatic --noinput \
 && chown -R gitward:gitward /var/lib/gitward /app/static
USER gitward
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT','8000'), timeout=4)" || exit 1
# Web: `manage.py up --workers 0`; workers: `manage.py worker --workers N`.
CMD ["python", "manage.py", "up", "--workers", "0"]
