# Corral's container image: the engine (`corral serve`) with its HTTP API on port 8765.
#
# Two stages. The builder has a C compiler: it builds Corral's wheel (corral-shim and
# corral-hook are compiled into it there) and the wheels of its dependencies. The final image
# installs those wheels into a virtual environment and has no compiler at all. It runs as an
# unprivileged user, keeps its data directory on a volume and takes PostgreSQL by URL
# (CORRAL_STORE_URL); without one it uses SQLite in the data directory (one engine only).
#
#   docker build -t corral .
#   docker run -p 8765:8765 -v corral-data:/var/lib/corral \
#     -e CORRAL_STORE_URL=postgresql://corral@db:5432/corral corral
#
# Plain HTTP beyond loopback is refused unless asked for: this image asks for it
# (--insecure-http), for a container reached only through its own network or a TLS-terminating
# proxy. To serve TLS itself, mount a certificate and key and override the command:
#   docker run … -v /etc/corral/tls:/tls:ro corral \
#     serve --http 0.0.0.0:8765 --tls-cert /tls/tls.crt --tls-key /tls/tls.key
# docs/how-to/deploy.md has the rest (systemd, Kubernetes with KubeRay, upgrades, backups).

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-bookworm AS builder
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# corral's own wheel (the native helpers compiled in), then every dependency as a wheel
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && ls /wheels/corral-*.whl

FROM python:${PYTHON_VERSION}-slim-bookworm
ENV CORRAL_DATA_DIR=/var/lib/corral \
    PATH=/opt/corral/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /wheels /tmp/wheels
RUN python -m venv /opt/corral \
    && /opt/corral/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
       /tmp/wheels/corral-*.whl \
    && rm -rf /tmp/wheels \
    && groupadd --system --gid 10001 corral \
    && useradd --system --uid 10001 --gid corral --home-dir /var/lib/corral \
       --shell /usr/sbin/nologin corral \
    && install -d -o corral -g corral -m 0700 /var/lib/corral \
    && corral --version
USER 10001:10001
WORKDIR /var/lib/corral
VOLUME ["/var/lib/corral"]
EXPOSE 8765
# /healthz answers while the process is up (/readyz also says whether the store answers).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(0 if urllib.request.urlopen(os.environ.get('CORRAL_HEALTH_URL', 'http://127.0.0.1:8765/healthz'), timeout=4).status == 200 else 1)"]
ENTRYPOINT ["corral"]
CMD ["serve", "--http", "0.0.0.0:8765", "--insecure-http"]
