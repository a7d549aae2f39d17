# The project's own image, one for every batchscope process in compose.yaml: the simulator
# (`batchscope sim serve`), the exporter (`batchscope exporter`) and Locust's master and workers
# (`locust -f batchscope/loadgen/adapter/locustfile.py`), and `batchscope tune` / `report`. compose.yaml gives each
# service its whole command. No `# syntax=` line: it would make BuildKit pull a frontend image from Docker Hub at every
# build (offline, the build fails), and nothing here needs a feature beyond the builder's own.
#
# Pinned to a patch release and a Debian release, so a rebuild next month runs the same Python; bump it on purpose.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid/gid, so files in named volumes have a predictable owner. /out holds the load generator's records.
RUN groupadd --gid 10001 batchscope \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin batchscope \
    && mkdir /out \
    && chown batchscope:batchscope /out

WORKDIR /app
# Only what the package needs (.dockerignore keeps the rest, .env included, out of the build context).
COPY pyproject.toml README.md ./
# The runtime dependencies (no [test] extra) first, in a layer of their own: a change to the code rebuilds only
# the layers below, in seconds, instead of downloading every dependency again.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY batchscope ./batchscope
COPY examples ./examples
# The sources stay in /app because Locust takes the locustfile by path:
# `locust -f batchscope/loadgen/adapter/locustfile.py`, as in the README.
RUN pip install --no-deps . && rm -rf build ./*.egg-info

USER batchscope

# simulator, exporter, Locust web UI, client metrics, Locust master
EXPOSE 8000 9648 8089 9646 5557

# No HEALTHCHECK here: each service checks its own port (compose.yaml), with `python -c` since the slim base
# has no curl.
CMD ["batchscope", "--help"]
