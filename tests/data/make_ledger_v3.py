"""How ``ledger_v3.sqlite`` and ``ledger_v3_summary.json`` were made (kept for the record).

Run once with the mvg_dask of schema version 3 (typed privacy losses, before streams), from a
checkout of that version::

    PYTHONPATH=. python tests/data/make_ledger_v3.py tests/data

It writes a small SQLite ledger with two datasets: typed losses (Gaussian DP and approximate
DP), every status (committed, aborted, pending with its key) and both neighbour relations, plus
``ledger show``'s summary of it as JSON: the migration test checks that a ledger migrated to
version 4 gives the same entries and the same spending, and that a stream can then be opened.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mvg_dask.ledger import open_ledger
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP


def _reserve(book, dataset, release_id, loss, calibration, **kw):  # type: ignore[no-untyped-def]
    book.reserve(
        dataset=dataset,
        release_id=release_id,
        loss=loss,
        calibration=calibration,
        spec_hash=f"hash-{release_id}",
        output=f"/out/{release_id}.zarr",
        noise_key="ab" * 32,
        seeded=False,
        **kw,
    )


def main(out: Path) -> None:
    path = out / "ledger_v3.sqlite"
    path.unlink(missing_ok=True)
    with open_ledger(path) as book:
        book.ensure_dataset("nightly", 3.0, 1e-5, "replace-one")
        _reserve(book, "nightly", "n-1", GaussianDP.calibrated(1.0, 1e-6), "exact")
        book.commit("n-1", clipped=2)
        _reserve(book, "nightly", "n-2", ApproxDP(0.5, 1e-6), "mvg-thm2")
        book.abort("n-2", "worker lost after the first chunk")
        _reserve(
            book, "nightly", "n-addremove", GaussianDP.calibrated(0.25, 1e-7), "exact",
            neighbours="add-remove", convert_neighbours=True,
        )  # fmt: skip
        book.commit("n-addremove")
        book.ensure_dataset("gauss", 2.0, 1e-6, "add-remove")
        _reserve(book, "gauss", "g-1", GaussianDP.calibrated(0.5, 1e-7), "exact",
                 neighbours="add-remove")  # fmt: skip
        book.commit("g-1")
        _reserve(book, "gauss", "g-pending", GaussianDP.calibrated(0.5, 1e-7), "exact",
                 neighbours="add-remove")  # fmt: skip
        summary = book.summary()
    (out / "ledger_v3_summary.json").write_text(
        json.dumps(summary, indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
