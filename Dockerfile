# syntax=docker/dockerfile:1
# One image for every Sketchboard process of docker-compose.yml: the API replicas, the pipeline
# (the Spark driver), the Spark master and workers, and the demo producer. Driver and executors
# must run the same Python with the same packages (PYSPARK_PYTHON), so the workers use it too.

# Spark's Kafka source (spark-sql-kafka-0-10 and its dependencies), from the pinned pom.
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /build
COPY jvm/spark-kafka/pom.xml jvm/spark-kafka/pom.xml
RUN mvn -q -B -f jvm/spark-kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/build/jars/spark-kafka

FROM python:3.11-slim-bookworm
# Java 17 for Spark; procps for the healthchecks (pgrep).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/venv/lib/python3.11/site-packages/pyspark/bin:$PATH \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    PYTHONUNBUFFERED=1
WORKDIR /app
# Dependencies first (a layer that changes only with the lock file), then the project.
COPY pyproject.toml requirements.lock README.md ./
# The runtime dependencies of pyproject.toml at the lock file's versions (not the test tools).
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir -q --upgrade pip \
    && python -c "import subprocess, sys, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', '-q', '-c', 'requirements.lock', *deps])"
COPY catalog catalog
COPY sketches sketches
COPY stopping stopping
COPY ingest ingest
COPY store store
COPY patterns patterns
COPY query query
COPY aggregates aggregates
COPY lag lag
COPY alerts alerts
COPY api api
COPY dashboard dashboard
COPY demo demo
COPY sketchboard sketchboard
COPY config config
COPY --from=jars /build/jars jars
# Editable: the default streams and alerts files are found next to the code (config/).
RUN pip install --no-cache-dir -q --no-deps -e .
# The ingest API's JSON scanner compiled once into Numba's cache (ingest/__pycache__), not by every
# container's API and ingest workers as they start (~5 s each).
RUN python -c "from api.ingest_routes import warm_columnar_path; warm_columnar_path()"
# The partials' HLL replay likewise (sketches/__pycache__), for the pipeline's first batches.
RUN python -c "from sketches.hll_build import warm; warm(12)"
EXPOSE 8000
CMD ["sketchboard", "api"]
