# One image for the release job pod, the Dask scheduler and the Dask workers.
# Build from the repository root:  docker build -t REGISTRY/mvg-dask:$(VERSION) .
# The tag must equal mvg_dask/_version.py (the manifests in cluster/ use it; a test checks it).
#
# Base: python:3.11-slim-bookworm (the package requires Python 3.11) with dask and distributed
# pinned by DASK_VERSION, rather than ghcr.io/dask/dask: that image is conda-based and brings its
# own numpy/BLAS builds, while client, scheduler and workers must share exactly the same wheels.
FROM python:3.11.14-slim-bookworm

ARG DASK_VERSION=2026.8.0

# tini reaps the nanny's worker processes and forwards SIGTERM from Kubernetes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 mvg \
    && useradd --uid 10001 --gid mvg --create-home --home-dir /home/mvg --shell /usr/sbin/nologin mvg

WORKDIR /opt/mvg-dask
COPY pyproject.toml README.md LICENSE ./
COPY mvg_dask ./mvg_dask
# the demo's spec templates ship in the package (mvg_dask.cli.demo_specs)
COPY pipelines/demo ./pipelines/demo
# the core only: the lab (lab/, the extra [experiments]: the paper's experiments and the
# baselines) is not part of the image
RUN pip install --no-cache-dir \
        "dask[array]==${DASK_VERSION}" "distributed==${DASK_VERSION}" \
        "/opt/mvg-dask[kubernetes,s3]"

# Worker malloc environment (see cluster/dask.yaml), read by every dask process in the image.
COPY cluster/dask.yaml /etc/dask/mvg-dask.yaml

ENV PYTHONUNBUFFERED=1 \
    MALLOC_MMAP_THRESHOLD_=33554432 \
    MALLOC_TRIM_THRESHOLD_=67108864

USER 10001:10001
WORKDIR /home/mvg
ENTRYPOINT ["/usr/bin/tini", "-g", "--"]
CMD ["mvg-dask", "--help"]
