"""A sweep sharded over the workers of an existing Dask cluster (``pip install 'gpuknap[cluster]'``).

Configurations are cut into shards; each shard is one task that runs the
in-process sweep (:func:`gpuknap.sweep._run.run_configs`, handed over by the caller) on its worker, with the
worker's own backend (CuPy where it has a GPU).  A task lost with its worker is
rerun (Dask's ``retries``); any task that still fails fails the whole sweep, so
a partial result is never returned as complete.  Each configuration's rows do
not depend on which shard it is in, so the rows equal the in-process sweep's.
"""
from __future__ import annotations

from typing import Any, Callable

from ..engine import report

#: Times a shard is retried after its worker died or it raised.
RETRIES = 2


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ValueError("a sweep on a Dask cluster (scheduler=, --scheduler) needs dask.distributed: "
                         "pip install 'gpuknap[cluster]'") from None
    return distributed


def _shard(run: Callable, configs: list, builder: Callable, kwargs: dict) -> tuple:
    """One task: the in-process sweep of some configurations."""
    return run(configs, builder, **kwargs)


class Cluster:
    """A connection to a Dask scheduler for the rounds of one sweep (``with Cluster(s) as run:``);
    ``run(run_configs, configs, builder, kwargs, shards)`` shards configurations over its workers.
    A ``distributed.Client`` given by the caller stays open; an address is connected once and
    closed at the end."""

    def __init__(self, scheduler: Any):
        distributed = _distributed()
        self.own = not isinstance(scheduler, distributed.Client)
        if self.own:
            if not isinstance(scheduler, str) or not scheduler or any(c.isspace() for c in scheduler):
                raise ValueError(f"scheduler (--scheduler) must be an address such as 'tcp://host:8786' or a "
                                 f"distributed.Client, got {scheduler!r}"[:300])
            try:
                self.client = distributed.Client(scheduler, timeout="10s")
            except Exception as exc:  # a refused, closed or foreign port: say so, never a traceback
                raise ValueError(f"scheduler (--scheduler) {scheduler}: cannot connect to a Dask scheduler there "
                                 f"({exc.__class__.__name__}: {str(exc)[:200]})") from None
        else:
            self.client = scheduler
        self.distributed = distributed

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own:
            self.client.close()

    def __call__(self, run: Callable, configs: list, builder: Callable, kwargs: dict,
                 shards: int | None = None) -> tuple[list, list]:
        if not configs:
            return [], []
        client = self.client
        workers = max(len(client.scheduler_info().get("workers", {})), 1)
        count = max(1, min(len(configs), shards if shards else 2 * workers))
        parts = [configs[i::count] for i in range(count)]
        futures = [client.submit(_shard, run, part, builder, kwargs, retries=RETRIES, pure=False) for part in parts]
        rows: list = []
        skipped: list = []
        for done, future in enumerate(self.distributed.as_completed(futures), 1):
            part_rows, part_skipped = future.result()  # raises if the shard failed after its retries
            rows += part_rows
            skipped += part_skipped
            report("shards", done, count)
        return rows, skipped


def run_on_cluster(scheduler: Any, run: Callable, configs: list, builder: Callable, kwargs: dict,
                   shards: int | None = None) -> tuple[list, list]:
    """``(rows, skipped)`` of ``configs``, sharded over the cluster at ``scheduler`` (an
    address such as ``tcp://host:8786``, or a ``distributed.Client``); each shard runs
    ``run(configs, builder, **kwargs)`` on a worker."""
    with Cluster(scheduler) as cluster:
        return cluster(run, configs, builder, kwargs, shards)
