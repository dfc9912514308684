"""``sweep``: which parallel configuration?  Every configuration of a grid on a cluster, searched,
or only the N best with certified pruning.

A configuration is ``stages`` (P), ``tensor_parallel`` (TP), ``context_parallel``
(CP), ``expert_parallel`` (EP), ``expert_tensor_parallel`` (ETP), ``micro_batch_size``,
``interleave`` (v) and ``device``, with what follows from the cluster:
``data_parallel`` = gpus / (P x TP x CP) and ``micro_batches`` = global_batch / (DP x
micro_batch_size) (:mod:`._grid`).  Every configuration's search runs in lockstep
with the others (:mod:`._run`), in process or sharded over a Dask cluster
(:mod:`._cluster`); models come from a spec, a Hugging Face config or a callable
(:mod:`._sources`).  With ``top`` only the best rows are wanted and most
configurations are pruned by a lower bound before any search (:mod:`._prune`).
"""
from __future__ import annotations

import contextlib
import math
import socket
from typing import Any, Mapping

from ..costs import DISPATCHERS
from ..engine import MAX_TOP, MEGABYTE, check_int, check_max_bytes, get_backend, plain
from ..search import PipelineModel
from ._cluster import Cluster, _distributed
from ._explain import order_rows
from ._framework import check_framework
from ._grid import MAX_CONFIGS, MAX_CONFIGS_TOP, Sweep, expand
from ._prune import best_rows
from ._pace import DEFAULT_MAX_SECONDS, check_max_seconds, in_batches, paced
from ._run import SCORES, run_configs
from ._sources import builder_of

#: Most rows ``top`` may ask for.
MAX_TOP_ROWS = 1_000


def _source(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any, device: dict,
            training: dict) -> tuple:
    """``(builder(config) -> PipelineModel, name, bucket, tokens per sample or None)``."""
    if callable(source):
        given = [k for k, v in {**device, **training}.items() if v is not None]
        given += [k for k, v in (("capacity", capacity), ("reserved", reserved)) if v is not None]
        if given:
            raise ValueError(f"{given[0]}: a callable source builds its models itself; give it the {given[0]} "
                             "there")
        checked = CheckedSource(source)
        return checked, checked.name, MEGABYTE if bucket is None else bucket, seq
    return builder_of(source, capacity, reserved, seq, bucket, device, training)


class CheckedSource:
    """A callable source whose every model is checked: an error other than ValueError, a result
    that is not a :class:`PipelineModel`, or a model whose micro-batches are not the configuration's
    becomes a ValueError naming the source (the configuration is then skipped with that reason)."""

    def __init__(self, source: Any):
        self.source = source
        self.name = getattr(source, "__name__", type(source).__name__)
        if hasattr(source, "shares_layer_times"):
            self.shares_layer_times = source.shares_layer_times

    def __call__(self, config: dict) -> PipelineModel:
        where = f"source {self.name!r}"
        try:
            model = self.source(config)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except Exception as exc:  # a bug in the caller's source: said by name, never a traceback
            raise ValueError(f"{where} raised {type(exc).__name__}: {exc}"[:500]) from None
        if not isinstance(model, PipelineModel):
            raise ValueError(f"{where} returned {type(model).__name__}, not a PipelineModel")
        if model.micro_batches != config["micro_batches"]:
            raise ValueError(f"{where}: its model has micro_batches={model.micro_batches}, the configuration "
                             f"micro_batches={config['micro_batches']} (global_batch / (data_parallel x "
                             "micro_batch_size)); build the model with config['micro_batches']")
        return model


def reachable(address: Any, seconds: float = 5.0) -> None:
    """Refuse at once a scheduler address nothing listens at (Dask itself would retry for its whole
    timeout): a TCP connection is tried first.  Other address forms are left to Dask."""
    if not isinstance(address, str) or any(c.isspace() for c in address):
        return  # a Client, or an address the cluster refuses by name
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    host, colon, port = rest.rstrip("/").rpartition(":")
    if scheme not in ("tcp", "tls", "ws", "wss") or not colon or not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=seconds).close()
    except OSError as exc:
        raise ValueError(f"scheduler (--scheduler) {address}: cannot connect to a Dask scheduler there "
                         f"({exc.strerror or exc.__class__.__name__})"[:300]) from None


def _grid_with(grid: Any, scalars: dict) -> Any:
    """The grid with the scalar sizes (``expert_parallel=`` ...) as one-value lists."""
    if not isinstance(grid, Mapping):
        return grid  # expand() says what is wrong
    out = dict(grid)
    for key, value in scalars.items():
        if value is None:
            continue
        if key in out:
            raise ValueError(f"{key} is given both as an argument and as a grid key; give it once")
        out[key] = [value]
    return out


#: Configurations run together in process (their jobs, each a few MB, held until the batch ends;
#: a red team's 2,880-configuration sweep held 9.2 GB at once), and batches sent to a cluster at once.
BATCH, CLUSTER_BATCHES = 128, 16


def sweep(source: Any, grid: Mapping, *, gpus: int, global_batch: int, score: str = "1f1b",
          top: int | None = None, top_splits: int = 1, backend: Any = "auto", scheduler: Any = None,
          capacity: Any = None, reserved: Any = None, seq: Any = None, bucket: Any = None,
          max_bytes: int | None = None, time_unit: float = 1e-3, shards: int | None = None, device: Any = None,
          gpus_per_node: int | None = None, efficiency: float | None = None, device_fields: Mapping | None = None,
          expert_parallel: int | None = None, expert_tensor_parallel: int | None = None,
          context_parallel: int | None = None, tp_comm_overlap: bool = False, dispatcher: str = "alltoall",
          framework: str | None = None, max_seconds: float | None = DEFAULT_MAX_SECONDS) -> Sweep:
    """Score the configurations of ``grid`` on ``gpus`` GPUs at ``global_batch`` samples a step.

    ``source``: a spec with a ``transformer`` section, a Hugging Face ``config.json``
    (then ``seq`` is needed) or a callable ``(config) -> PipelineModel``.  ``grid`` maps
    any of :data:`GRID_KEYS` to a list of values (a missing key keeps its default: sizes 1,
    ``expert_tensor_parallel`` the TP size, ``device`` the source's).  ``score``: ``slowest``
    or ``1f1b`` (how a configuration's split is chosen); ``top_splits`` splits per
    configuration.  ``top``: only the first ``top`` rows of the full sweep, exactly, found
    with certified pruning (most configurations are never searched; ``Sweep.pruned`` says how
    many); None: every row.  ``time_unit``: seconds per profile time unit (analytic and
    Hugging Face models are in ms).  ``scheduler``: a Dask scheduler address or
    ``distributed.Client`` to shard the searches over (``shards`` of them, default two per
    worker); None runs in process.  Rows are identical either way.  ``device`` (a preset
    name; ``gpus_per_node``, ``efficiency``, ``device_fields`` override it) is the source's
    device where the grid has no ``device`` list; ``expert_parallel``, ``expert_tensor_parallel``
    and ``context_parallel`` are one-value grid lists.  ``tp_comm_overlap``: every configuration
    overlaps TP communication with its GEMMs (Megatron's ``--tp-comm-overlap``; a spec's
    transformer section may say so itself).  ``dispatcher``: how every configuration's MoE
    layers send tokens to their experts (``alltoall`` or ``flex``, see :class:`gpuknap.costs.Training`).
    ``framework`` (``megatron``, ``mindformers``): every row is a plan that framework states, ranked by
    its time (:mod:`._framework`); None: each layer on its own option.  ``max_seconds``: a sweep of every row whose time,
    estimated on a pilot of its configurations before the rest run (:mod:`._pace`), is over
    this is refused (None: no limit and no pilot); so is a sweep of the ``top`` rows whose
    estimate after a round of its pruned search (:func:`._pace.check_pace`) is over it.
    """
    gpus, global_batch, top, top_splits, max_bytes, time_unit, shards, gpus_per_node, efficiency, max_seconds = map(
        plain, (gpus, global_batch, top, top_splits, max_bytes, time_unit, shards, gpus_per_node, efficiency,
                max_seconds))  # NumPy scalars as the numbers they hold
    if shards is not None:
        shards = check_int(shards, "shards", 1)
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} for a sweep (every row carries its simulated time), "
                         f"got {score!r}")
    top_splits = check_int(top_splits, "top_splits", 1)
    if top_splits > MAX_TOP:
        raise ValueError(f"top_splits={top_splits} is over the limit of {MAX_TOP} splits per configuration")
    if top is not None:
        top = check_int(top, "top", 1)
        if top > MAX_TOP_ROWS:
            raise ValueError(f"top={top} is over the limit of {MAX_TOP_ROWS:,} rows; give top=None (--all) for "
                             "every row of a smaller grid")
    get_backend(backend)
    max_seconds = check_max_seconds(max_seconds)
    if not isinstance(tp_comm_overlap, bool):
        raise ValueError(f"tp_comm_overlap must be true or false, got {tp_comm_overlap!r}")
    framework = check_framework(framework)
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatcher must be one of {', '.join(DISPATCHERS)}, got {dispatcher!r}")
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    if not (isinstance(time_unit, (int, float)) and not isinstance(time_unit, bool) and 0 < time_unit < math.inf):
        raise ValueError(f"time_unit must be a positive number of seconds, got {time_unit!r}")
    grid = _grid_with(grid, {"expert_parallel": expert_parallel, "expert_tensor_parallel": expert_tensor_parallel,
                             "context_parallel": context_parallel})
    keywords = {"device": device, "gpus_per_node": gpus_per_node, "efficiency": efficiency,
                "device_fields": device_fields}
    said = {**({"tp_comm_overlap": True} if tp_comm_overlap else {}),
            **({"dispatcher": dispatcher} if dispatcher != "alltoall" else {})}
    builder, _, bucket, tokens = _source(source, capacity, reserved, seq, bucket, keywords, said)
    configs, skipped = expand(grid, gpus, global_batch, getattr(builder, "layers", None),
                              MAX_CONFIGS if top is None else MAX_CONFIGS_TOP)
    if not configs:
        raise ValueError("no valid configuration in the grid: "
                         + "; ".join(sorted({s["reason"] for s in skipped}))[:400])
    kwargs = dict(global_batch=int(global_batch), score=score, top=top_splits, bucket=bucket, backend=backend,
                  max_bytes=max_bytes, time_unit=float(time_unit), tokens=tokens, framework=framework)
    if scheduler is not None:
        _distributed()  # says how to install it, before any connection is tried
        reachable(scheduler)
    with (Cluster(scheduler) if scheduler is not None else contextlib.nullcontext()) as cluster:
        step = BATCH if cluster is None else BATCH * CLUSTER_BATCHES

        def run(part: list) -> tuple[list, list]:
            return run_configs(part, builder, **kwargs) if cluster is None else cluster(
                run_configs, part, builder, kwargs, shards)

        if top is None or top >= len(configs):  # nothing to prune: every row, paced by its pilot
            if cluster is None:  # the compiled pass loads (about a second) before the pilot is timed
                get_backend(backend).fused(math.inf)
            rows, bad = paced(configs, run, step, max_seconds)
            counts = {"searched": len(configs), "pruned": 0, "invalid": 0, "infeasible": 0}
            if top is not None:  # the first rows of the full sweep, as the pruned path gives them
                rows = order_rows(rows, configs)[:top]
        else:
            rows, bad, counts = best_rows(configs, builder, top, lambda chunk: in_batches(chunk, step, run),
                                          lambda rs: order_rows(rs, configs), float(time_unit), MAX_CONFIGS, bucket,
                                          max_seconds)
    if not rows:  # every configuration failed to build: the input is wrong, not the memory too small
        raise ValueError("no configuration of the grid can be built: "
                         + "; ".join(sorted({s["reason"] for s in bad}))[:600])
    place = {tuple(sorted(c.items())): i for i, c in enumerate(configs)}
    bad.sort(key=lambda s: place.get(tuple(sorted(s["config"].items())), 0))  # shards finish in any order
    return Sweep(order_rows(rows, configs), skipped + bad, top=top, searched=counts["searched"],
                 pruned=counts["pruned"], unfit=counts["infeasible"])
