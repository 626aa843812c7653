# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python (mvg-dask)
#     language: python
#     name: mvg-dask
# ---

# %% [markdown]
# # Releasing on an existing Dask cluster, over TLS
#
# On a shared cluster the analyst's notebook is a client: `Client(address, security=...)`. The
# release key travels to the workers inside task arguments, so a private release refuses a
# plaintext `tcp://` scheduler that is not on loopback; use TLS.
#
# Here the "existing cluster" is a TLS-only `LocalCluster` on loopback with certificates made
# for the occasion by `trustme`, so the notebook runs anywhere. On a real cluster, skip the two
# cells marked *stand-in* and use your scheduler's address and your certificate files (for
# Kubernetes, the mounted Secret directory: see the notes at the end).

# %%
import shutil
from pathlib import Path

import trustme
from distributed import Client, LocalCluster
from distributed.security import Security

from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.datasets import load_ctg
from mvg_dask.engine.security import TransportError, check_transport, make_security

WORK = Path("scratch/existing-cluster")
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

# %% [markdown]
# *Stand-in:* a test CA and one certificate for 127.0.0.1, written as a Kubernetes TLS Secret
# mounts them (`ca.crt`, `tls.crt`, `tls.key`).

# %%
certs = WORK / "tls"
certs.mkdir()
ca = trustme.CA()
leaf = ca.issue_cert("127.0.0.1", "localhost")
ca.cert_pem.write_to_path(str(certs / "ca.crt"))
leaf.cert_chain_pems[0].write_to_path(str(certs / "tls.crt"))
leaf.private_key_pem.write_to_path(str(certs / "tls.key"))
sorted(p.name for p in certs.iterdir())

# %% [markdown]
# *Stand-in:* a TLS-only scheduler and two workers (what `dask scheduler --protocol tls` and
# `dask worker --tls-...` or the dask-kubernetes operator give you).

# %%
pem = {"ca": str(certs / "ca.crt"), "cert": str(certs / "tls.crt"), "key": str(certs / "tls.key")}
cluster_security = Security(
    tls_ca_file=pem["ca"],
    tls_scheduler_cert=pem["cert"],
    tls_scheduler_key=pem["key"],
    tls_worker_cert=pem["cert"],
    tls_worker_key=pem["key"],
    tls_client_cert=pem["cert"],
    tls_client_key=pem["key"],
    require_encryption=True,
)
cluster = LocalCluster(
    n_workers=2,
    threads_per_worker=1,
    host="127.0.0.1",
    protocol="tls",
    security=cluster_security,
    dashboard_address=":0",
)
address = cluster.scheduler_address
address

# %% [markdown]
# ## Connect as a client
# `make_security(tls_dir=...)` reads `ca.crt`, `tls.crt` and `tls.key` (or give `ca_file`,
# `cert` and `key`); it requires encryption.

# %%
security = make_security(tls_dir=certs)
client = Client(address, security=security)
client.wait_for_workers(2)
print("scheduler:", client.scheduler.address, "| dashboard:", client.dashboard_link)

# %% [markdown]
# ## A release spec in Python, and the release
# `api.release_spec` takes the YAML spec's sections as keywords (same schema, same errors).
# Every worker must reach the input and output stores: here a local directory; on a cluster a
# shared filesystem or an object store (`s3://...` with `storage_options`).

# %%
ctg = load_ctg()
store = write_matrix(ctg.X, WORK / "ctg.zarr", feature_names=ctg.feature_names, record_chunk=500)
spec = api.release_spec(
    name="ctg-identity",
    input={"store": store, "variable": "X"},
    domain={"box": {"lower": 0.0, "upper": 1.0}},
    query="identity",
    mechanism={"allocation": {"strategy": "binary", "important": [0, 7, 9], "share": 0.8}},
    privacy={"epsilon": 1.0, "delta": 1.0 / ctg.n_records},
    output={"store": str(WORK / "ctg-identity.zarr")},
    ledger={
        "path": str(WORK / "ledger.sqlite"),
        "dataset": "ctg",
        "budget": {"epsilon": 3.0, "delta": 1e-3},
    },
)
api.preview(spec)

# %%
result = api.release(spec, client=client)
print(result.release_id, "->", Path(result.output).name)

# %% [markdown]
# The same without a client object: `api.release(spec, scheduler=address, security=security)`,
# or from a shell `mvg-dask release spec.yaml --scheduler tls://... --tls-dir DIR`.
#
# A spec error is one line naming the field, before anything is read or charged:

# %%
try:
    api.release_spec(**{**spec.model_dump(), "privacy": {"epsilon": 0, "delta": 1e-5}})
except ValueError as exc:
    print(exc)

# %% [markdown]
# And a private key never goes in plaintext to another machine (checked from the address alone,
# before the ledger reserves anything):

# %%
for candidate in ("tcp://10.0.0.5:8786", "tcp://127.0.0.1:8786", address):
    try:
        check_transport(candidate, seeded=False)
        print(f"{candidate}: accepted")
    except TransportError as exc:
        print(f"{candidate}: refused ({str(exc)[:90]}...)")

# %%
client.close()
cluster.close()

# %% [markdown]
# ## Notes for Kubernetes (`cluster/README.md`)
#
# * **Image**: one image (`Dockerfile`) for the job pod, the scheduler and the workers; the
#   client, scheduler and workers must run the same mvg_dask, dask, distributed, numpy,
#   randomgen, zarr and cloudpickle versions, or the release refuses to start (nothing charged).
# * **Address**: in a DaskJob's job pod the operator sets `DASK_SCHEDULER_ADDRESS`; `api.release`
#   and `mvg-dask release` use it when no scheduler is given (an unreachable address is an error,
#   never a silent local run). From a notebook outside the cluster, port-forward the scheduler
#   service and connect with its `tls://` address.
# * **TLS**: the overlays mount the Secret `mvg-dask-tls` (`ca.crt`, `tls.crt`, `tls.key`);
#   `make_security(tls_dir="/etc/mvg-dask/tls")` or `--tls-dir` reads it.
# * **Ledger**: a shared PostgreSQL ledger (`ledger: {url: postgresql://mvg_ledger@db/ledger}`,
#   password from `PGPASSWORD` or a passfile), so every job charges one budget.
# * **Overlays**: `scheduled` (CronJob, ephemeral cluster, retry-safe release id), `one-off`
#   (DaskJob, TLS end to end), `long-lived` (a DaskCluster used with `--scheduler tls://...`).
