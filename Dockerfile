# gpufair server image. Configuration comes from the environment (GPUFAIR_DATABASE_URL).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 gpufair
USER gpufair

EXPOSE 50051
# `gpufair serve` migrates the database (under an advisory lock) before it starts serving.
ENTRYPOINT ["gpufair"]
# Listening beyond loopback needs TLS and tokens, or an explicit --insecure (the compose file
# publishes the port on the host's loopback only).
CMD ["serve", "--address", "0.0.0.0:50051", "--insecure"]
