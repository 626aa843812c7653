"""Transport security: a TLS release on loopback, and the refusal of plaintext to a remote host."""

from __future__ import annotations

import subprocess
import sys

import pytest
from distributed import Client

from mvg_dask import api
from mvg_dask.cli import main
from mvg_dask.engine.security import TransportError, check_transport, is_loopback, make_security
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec
from tests.tls_helpers import make_certs, tls_loopback_cluster


@pytest.mark.parametrize(
    "address",
    [
        "tcp://10.0.0.5:8786",
        "10.0.0.5:8786",
        "tcp://scheduler.example:8786",
        "tcp://[2001:db8::1]:8786",
        "ws://10.0.0.5:8786",
        "tcp://mvg-dask-scheduler:8786",
    ],
)
def test_plaintext_to_a_remote_scheduler_is_refused(address):
    with pytest.raises(TransportError, match="--insecure-transport"):
        check_transport(address, seeded=False, insecure=False)


@pytest.mark.parametrize(
    ("address", "seeded", "insecure"),
    [
        ("tls://10.0.0.5:8786", False, False),
        ("tcp://127.0.0.1:8786", False, False),
        ("tcp://127.8.0.3:8786", False, False),
        ("tcp://localhost:8786", False, False),
        ("tcp://[::1]:8786", False, False),
        ("inproc://10.0.0.5/1/2", False, False),
        ("tcp://10.0.0.5:8786", True, False),  # seeded: not private
        ("tcp://10.0.0.5:8786", False, True),  # the curator accepts it
        (None, False, False),  # the embedded LocalCluster
    ],
)
def test_encrypted_loopback_seeded_or_accepted_transports_pass(address, seeded, insecure):
    check_transport(address, seeded=seeded, insecure=insecure)


def test_loopback_is_an_address_property_not_a_name_lookup():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("10.1.2.3")
    assert not is_loopback("localhost.example.org")
    assert not is_loopback("my-host")


def test_make_security_from_a_secret_directory_and_from_files(tmp_path):
    certs = make_certs(tmp_path / "tls")
    sec = make_security(tls_dir=certs)
    assert sec is not None and sec.require_encryption
    assert sec.tls_ca_file == str(certs / "ca.crt")
    assert sec.tls_client_cert == str(certs / "tls.crt")
    assert sec.tls_client_key == str(certs / "tls.key")
    same = make_security(ca_file=certs / "ca.crt", cert=certs / "tls.crt", key=certs / "tls.key")
    assert same is not None and same.get_connection_args("client")["ssl_context"] is not None
    assert make_security() is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cert": "tls.crt"}, "both --tls-ca-file and --tls-cert"),
        ({"ca_file": "nowhere.crt", "cert": "tls.crt"}, "is not a readable file"),
        ({"tls_dir": "missing"}, "is not a directory"),
        ({"tls_dir": "tls", "cert": "tls.crt"}, "either --tls-dir or"),
    ],
)
def test_make_security_rejects_incomplete_or_missing_files(tmp_path, monkeypatch, kwargs, message):
    make_certs(tmp_path / "tls")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TransportError, match=message):
        make_security(**{k: tmp_path / v if k == "tls_dir" else v for k, v in kwargs.items()})


@pytest.mark.cluster
def test_a_release_through_a_tls_scheduler_and_tls_workers(tmp_path):
    certs = make_certs(tmp_path / "tls")
    X = data(4, 1200, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=300)
    spec = spec_dict(store, str(tmp_path / "out.zarr"))
    with tls_loopback_cluster(tmp_path, certs) as address:
        assert address.startswith("tls://127.0.0.1:")
        # the scheduler speaks TLS only: a client without certificates cannot connect
        with pytest.raises((OSError, TypeError)):
            Client(address.replace("tls://", "tcp://"), timeout="3s")
        sec = make_security(tls_dir=certs)
        check_transport(address, seeded=False)
        with Client(address, security=sec, timeout="30s") as client:
            info = client.scheduler_info()
            assert all(w.startswith("tls://") for w in info["workers"])
            res = api.release(spec, client=client, progress=False)  # unseeded: a private key
        assert not res.seeded
    ds = api.open_release(res.output)
    assert ds.attrs["mvg_dask_status"] == "complete"
    assert ds["X"].shape == (4, 1200)


def _spec_with_ledger(tmp_path):
    X = data(3, 200, seed=4)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    ledger = tmp_path / "ledger.sqlite"
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}},
    )
    return write_spec(tmp_path / "spec.yaml", spec), ledger


def test_the_cli_refuses_plaintext_to_a_remote_scheduler_before_any_reservation(tmp_path, capsys):
    spec, ledger = _spec_with_ledger(tmp_path)
    assert main(["release", str(spec), "--quiet", "--scheduler", "tcp://10.0.0.5:8786"]) == 1
    err = capsys.readouterr().err
    assert "refusing to send the release key to tcp://10.0.0.5:8786" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    assert not ledger.exists()  # nothing reserved, nothing charged
    assert not (tmp_path / "out.zarr").exists()


def test_the_cli_rejects_tls_options_that_do_not_fit(tmp_path, capsys):
    spec, ledger = _spec_with_ledger(tmp_path)
    assert main(["release", str(spec), "--quiet", "--tls-dir", str(tmp_path / "nope")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    certs = make_certs(tmp_path / "tls")
    assert main(["release", str(spec), "--quiet", "--tls-dir", str(certs)]) == 1
    assert "TLS options need --scheduler" in capsys.readouterr().err
    assert not ledger.exists()


@pytest.mark.cluster
def test_the_cli_releases_through_tls_with_a_secret_directory(tmp_path):
    certs = make_certs(tmp_path / "tls")
    spec, ledger = _spec_with_ledger(tmp_path)
    with tls_loopback_cluster(tmp_path, certs, workers=1) as address:
        cmd = [sys.executable, "-m", "mvg_dask", "release", str(spec), "--quiet"]
        cmd += ["--scheduler", address, "--tls-dir", str(certs), "--release-id", "tls-run-1"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "release tls-run-1 complete" in out.stdout
    assert ledger.exists()
    assert api.open_release(str(tmp_path / "out.zarr")).attrs["mvg_dask_release_id"] == "tls-run-1"
