"""How ``ledger_v2.sqlite`` and ``ledger_v2_summary.json`` were made (kept for the record).

Run once with the mvg_dask of schema version 2 (before privacy loss was stored as one typed
value), from a checkout of that version::

    PYTHONPATH=. python tests/data/make_ledger_v2.py tests/data

It writes a small SQLite ledger with three datasets and entries of every calibration family
(``exact`` with its mu, paper calibrations with a bare (epsilon, delta)), every status
(committed, aborted, pending) and both neighbour relations (an add-remove release converted into
a replace-one budget), plus ``ledger show``'s summary of it as JSON: the migration test checks
that a migrated ledger gives the same entries and the same spending.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mvg_dask.engine.ledger import open_ledger


def _reserve(book, dataset, release_id, eps, delta, calibration, mu, **kw):  # type: ignore[no-untyped-def]
    book.reserve(
        dataset=dataset,
        release_id=release_id,
        epsilon=eps,
        delta=delta,
        calibration=calibration,
        mu=mu,
        spec_hash=f"hash-{release_id}",
        output=f"/out/{release_id}.zarr",
        noise_key="00" * 32,
        seeded=False,
        **kw,
    )


def main(out: Path) -> None:
    path = out / "ledger_v2.sqlite"
    path.unlink(missing_ok=True)
    with open_ledger(path) as book:
        # a mix: Gaussian-DP releases and paper calibrations (PLD or basic composition)
        book.ensure_dataset("mixed", 10.0, 1e-5, "replace-one")
        _reserve(
            book,
            "mixed",
            "m-exact-1",
            1.0,
            1e-6,
            "exact",
            0.23670438063975527,
            neighbours="replace-one",
        )
        book.commit("m-exact-1", clipped=3)
        _reserve(book, "mixed", "m-thm2", 0.5, 1e-6, "mvg-thm2", None)
        book.commit("m-thm2", clipped=0)
        _reserve(book, "mixed", "m-mgm", 0.5, 1e-6, "mgm", None)
        book.abort("m-mgm", "worker lost after the first chunk")
        _reserve(
            book, "mixed", "m-addremove", 0.25, 1e-7, "exact", 0.057659086201724254,
            neighbours="add-remove", convert_neighbours=True,
        )  # fmt: skip
        book.commit("m-addremove")
        _reserve(book, "mixed", "m-pending", 0.3, 1e-7, "mgm-udn", None)
        # only exact releases: Gaussian-DP composition
        book.ensure_dataset("gauss", 2.0, 1e-6, "replace-one")
        _reserve(book, "gauss", "g-1", 1.0, 5e-7, "exact", 0.22908694270535)
        book.commit("g-1")
        _reserve(book, "gauss", "g-2", 0.5, 2e-7, "exact", 0.1)
        book.commit("g-2")
        # an add-remove budget with one paper release: basic composition
        book.ensure_dataset("addrem", 3.0, 1e-5, "add-remove")
        _reserve(book, "addrem", "a-thm3", 1.5, 2e-6, "mvg-thm3", None, neighbours="add-remove")
        book.commit("a-thm3")
        summary = book.summary()
    (out / "ledger_v2_summary.json").write_text(
        json.dumps(summary, indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
