"""Dask clients: an existing scheduler, or the embedded LocalCluster sized to the machine."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from distributed import Client, LocalCluster, as_completed

log = logging.getLogger("mvg_dask")


@contextmanager
def connect(
    scheduler: str | None = None,
    *,
    n_workers: int | None = None,
    memory_limit: str | None = None,
) -> Iterator[Client]:
    """Yield a client: to ``scheduler`` if given, else to a new LocalCluster on loopback.

    Parameters
    ----------
    scheduler : str, optional
        Scheduler address such as ``tcp://127.0.0.1:8786``.
    n_workers : int, optional
        LocalCluster workers (default: one per core, one thread each).
    memory_limit : str, optional
        LocalCluster memory limit per worker (default: machine memory / workers).

    Yields
    ------
    distributed.Client
        The client; closed (with its cluster) on exit.
    """
    if scheduler is not None:
        client = Client(scheduler, timeout="30s")
        try:
            yield client
        finally:
            client.close()
        return
    workers = n_workers or max(1, os.cpu_count() or 1)
    kwargs: dict[str, Any] = {"memory_limit": memory_limit} if memory_limit else {}
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        **kwargs,
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


class Progress:
    """Progress over a known number of tasks: a bar in a terminal, log lines otherwise."""

    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.enabled = enabled
        self._bar: Any = None
        self._next_log = 0.1
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=label, unit="chunk", file=sys.stderr)
        elif enabled:
            log.info("%s: %d chunks", label, total)

    def update(self, n: int = 1) -> None:
        """Record ``n`` finished tasks."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and self.done / self.total >= self._next_log:
            log.info(
                "%s: %d/%d chunks (%.0f%%)",
                self.label,
                self.done,
                self.total,
                100 * self.done / self.total,
            )
            while self._next_log <= self.done / self.total:
                self._next_log += 0.1

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.close()


def gather_with_progress(
    client: Client,
    futures: list[Any],
    progress: Progress,
    *,
    keep: bool = True,
    on_result: Callable[[int], None] | None = None,
) -> list[Any]:
    """Wait for every future, updating ``progress``; the first failure cancels the rest.

    Parameters
    ----------
    client : distributed.Client
        The client.
    futures : list of Future
        Futures to wait for.
    progress : Progress
        Progress reporter.
    keep : bool
        Collect the results (``False``: only wait, results stay on the workers).
    on_result : callable, optional
        Called with the number of finished futures after each one.

    Returns
    -------
    list
        Results in the order of ``futures`` (``None`` entries when ``keep`` is False).
    """
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    done = 0
    try:
        for fut in as_completed(futures):
            if fut.status == "error":
                fut.result()  # raises the task's own exception
            if keep:
                results[index[fut.key]] = fut.result()
            done += 1
            progress.update()
            if on_result is not None:
                on_result(done)
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        progress.close()
    return results
