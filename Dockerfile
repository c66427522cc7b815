# gpufair server image. Configuration comes from the environment: GPUFAIR_DATABASE_URL, and any
# `serve` option --foo-bar as GPUFAIR_FOO_BAR.
# The base image is pinned to a full version (bump it on purpose, with the tests).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# The dependencies in a layer of their own, exactly as pinned in constraints.txt (written by
# scripts/constraints.py): a change of gpufair's code does not reinstall them.
COPY constraints.txt ./
RUN pip install --requirement constraints.txt

# The server alone: no embedded PostgreSQL (compose gives it one), no simulator plots.
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-deps . \
    && pip check \
    && useradd --system --uid 10001 gpufair
# The example cluster files, for `docker compose exec gpufair gpufair apply -f examples/...`.
COPY examples ./examples

USER gpufair
EXPOSE 50051
# SERVING from the gRPC health service, on the port the server listens on.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=6 \
    CMD ["python", "-c", "import grpc, os; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; port = os.environ.get('GPUFAIR_ADDRESS', ':50051').rpartition(':')[2]; assert g.HealthStub(grpc.insecure_channel('127.0.0.1:' + port)).Check(h.HealthCheckRequest(), timeout=3).status == h.HealthCheckResponse.SERVING"]
# `gpufair serve` migrates the database (under an advisory lock) before it starts serving.
ENTRYPOINT ["gpufair"]
# Listening beyond loopback needs TLS and tokens, or an explicit --insecure (the compose file
# publishes the port on the host's loopback only).
CMD ["serve", "--address", "0.0.0.0:50051", "--insecure"]
