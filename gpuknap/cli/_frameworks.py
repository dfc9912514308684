"""Training frameworks on the command line: ``best --emit megatron|mindformers|json`` and
``rank --from FILE`` (the parser is in :mod:`._main`, the other commands in :mod:`._commands` and :mod:`._split`).

``best --emit FRAMEWORK`` runs the framework-constrained search (only plans the framework runs as
written), prints the settings with the cost against the unconstrained plan, and with ``--json``
the usual JSON with a ``settings`` object.  ``best --emit json`` is ``best --json`` with each
framework's settings for the best split (the closest each can express).  ``rank --from FILE``
reads a framework's settings, builds the model the way they run it (their parallel sizes, batch
and sequence, where given) and scores their split with the recompute they set.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from .. import formats
from ..costs import DISPATCHERS
from ..formats import framework
from ..schedule import simulated_plans
from ..search import best_splits, constrained_splits, with_grouped
from ._flags import EXIT_OK
from ._plots import plot_best
from ._progress import note
from ._report import format_split, run_times, split_record

EXIT_INFEASIBLE = 1
#: Run values a settings file may give -> (argument attribute, command-line flag).
RUN_FLAGS = {"tp": ("tp", "--tp"), "cp": ("cp", "--cp"), "ep": ("ep", "--ep"), "etp": ("etp", "--etp"),
             "dp": ("dp", "--dp"), "micro_batch": ("micro_batch_size", "--micro-batch-size"), "seq": ("seq", "--seq"),
             "micro_batches": ("micro_batches", "--micro-batches")}


def _bad(exc: Any, where: str) -> ValueError:
    return ValueError(f"{where}: {exc}")


def best_emit(args: argparse.Namespace, spec: Any, stages: int, chunks: int, in_flight: Any, backend: Any,
              max_bytes: int | None, emit: Callable[[dict, str], None], header: dict) -> int:
    """``best --emit megatron|mindformers``: the framework-constrained plan's settings."""
    name, model = args.emit, spec.model
    where = f"--emit {name}: {spec.source}"
    if args.bound:
        raise ValueError(f"--bound: certifies the unconstrained search's bucketing; the {name}-constrained search "
                         "compares exact bytes (drop --bound or --emit)")
    free = best_splits(model, stages, 1, args.score, spec.bucket, backend, in_flight, max_bytes, interleave=chunks)
    if getattr(free, "refusal", ""):  # stopped at a cap: the constrained search would stop there too, later
        raise ValueError(free.refusal)
    try:
        mtp = formats.mtp_layers(spec.source)
        found = constrained_splits(model, stages, name, args.top, args.score, spec.bucket, backend, in_flight,
                                   max_bytes, chunks, [f[0] for f in free])
    except ValueError as exc:
        raise _bad(exc, where) from None
    shape = f"{stages} stages" + (f" x {chunks} chunks" if chunks > 1 else "")
    payload = {**header, "stages": stages, "interleave": chunks, "score": args.score, "top": args.top,
               "exact": getattr(found, "exact", True), "results": []}
    if not found:
        emit(payload, f"no feasible split of {spec.name} into {shape} fits the device memory with settings "
                      f"{name} runs as written")
        return EXIT_INFEASIBLE
    counts, value, _, names, _ = found[0]
    exact = getattr(found, "exact", True)
    search = "exact" if exact else f"a local search, not proven optimal; the optimum is at least {found.lower_bound:.6g}"
    notes = [f"framework-constrained search ({search}): {args.score} {value:.6g}"]
    even = _even_plan(model, name, stages, chunks, in_flight, spec.bucket, counts, names, args.score) \
        if chunks > 1 and args.score != "simulated" else None
    if even is not None:  # the closed form's plan puts unequal chunks that the schedule pays for
        counts, names, value, best_time, even_time, choice, runs = even
        exact = False
        as_runs = "" if runs is None else f" (as runs, sends and tails included: {runs[1]:.4g} s against {runs[0]:.4g} s)"
        default = "Megatron's default" if name == "megatron" else "decoder layers even, the remainder on the last"
        notes.append(f"emitted: the even split ({default}), which simulates to {even_time:.6g} against "
                     f"{best_time:.6g}{as_runs} for the {args.score} score's best plan (the score sees only stage "
                     f"totals, not unequal chunks); it scores {value:.6g}; --score simulated searches the simulated "
                     "time")
        payload["even_split"] = {"counts": [int(c) for c in counts], "iteration_time_simulated": even_time,
                                 "iteration_time_s": runs[1] if runs else None}
        payload["exact"] = False  # the even split is emitted, not the search's proven best
        found = [(counts, value, choice, names, None)]
    if free:
        cost = value - free[0][1]
        notes.append(f"the unconstrained plan scores {free[0][1]:.6g}: running as {name} sets it costs {cost:+.6g} "
                     f"({100 * cost / free[0][1]:+.2f}%)" if free[0][1] else "")
    gm = with_grouped(model)
    try:
        text = formats.emit(name, gm, counts, name=spec.name, score=value, in_flight=in_flight, chunks=chunks,
                            names=names, mtp=mtp, notes=[n for n in notes if n],
                            model_flags=formats.megatron_model_flags(spec.source))
    except ValueError as exc:
        raise _bad(exc, where) from None
    simulated = simulated_plans(gm, [(list(c), list(n)) for c, _, _, n, _ in found], chunks)
    for (c, v, choice, _, _), sim in zip(found, simulated):  # the names the framework runs, simulated
        payload["results"].append({**split_record(gm, list(c), choice, args.score, v, in_flight, chunks,
                                                  bucket=spec.bucket), "iteration_time_simulated": sim})
    payload["settings"] = {"framework": name, "text": text, "exact_search": exact,
                           "unconstrained_score": free[0][1] if free else None, "mtp_layers": mtp}
    if args.plot:
        plot_best(payload["results"], None, args.plot, f"{spec.name}, {shape}: as {name} runs it {list(counts)}")
    emit(payload, text.rstrip("\n"))
    return EXIT_OK


def settings_of_best(spec: Any, found: Any, in_flight: Any, chunks: int) -> dict:
    """``best --emit json``: each framework's settings for the best split (the closest each can express)."""
    out: dict = {}
    if not found:
        return out
    counts, value, choice = found[0][:3]
    for name in formats.EMITTERS:
        try:
            out[name] = {"text": formats.emit(name, spec.model, counts, choice, spec.name, value, in_flight, chunks,
                                              mtp=formats.mtp_layers(spec.source),
                                              model_flags=formats.megatron_model_flags(spec.source))}
        except ValueError as exc:
            out[name] = {"error": str(exc)}
    return out


def _merge(args: argparse.Namespace, settings: Any, source: str) -> dict:
    """Set the run values the settings give on ``args`` (refusing a flag that says otherwise);
    returns the extra keywords for the spec (sequence parallelism)."""
    run = dict(getattr(settings, "run", {}) or {})
    gbs, round_batch = run.pop("global_batch", None), run.pop("round_batch", None)
    gbs_flag = run.pop("global_batch_flag", None) or "--global-batch-size"
    defaulted, etp_is_tp = run.pop("defaulted", {}), run.pop("etp_is_tp", False)  # a whole Megatron run's defaults
    extra = {}
    for key, value in run.items():
        if key in RUN_FLAGS:
            attr, flag = RUN_FLAGS[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"{key}: expected an integer >= 1, got {value!r}", source)
            given = getattr(args, attr, None)
            if given is not None and given != value:
                why = f" ({defaulted[key]})" if key in defaulted else ""
                raise _bad(f"the settings run {key} = {value}{why}, but {flag} {given}; drop the flag or fix the file",
                           source)
            setattr(args, attr, value)
        elif key in ("sequence_parallel", "tp_comm_overlap"):
            if not isinstance(value, bool):
                raise _bad(f"{key}: expected true or false, got {value!r}", source)
            if key == "tp_comm_overlap" and args.tp_comm_overlap and not value:
                raise _bad("--tp-comm-overlap given, but the settings run without it; drop the flag or fix the file",
                           source)
            extra[key] = value
        elif key == "moe_dispatcher" and value in DISPATCHERS:  # the dispatcher the settings run, costed so
            if args.dispatcher is not None and args.dispatcher != value:
                raise _bad(f"the settings run --moe-token-dispatcher-type {value}, but --dispatcher {args.dispatcher}; "
                           "drop the flag or fix the file", source)
            extra["dispatcher"] = value
        elif key == "flash_attention" and formats.is_config(args.spec):  # the attention kernel the settings run
            extra["flash_attention"] = value
            if not value:
                note("use_flash_attention is false" + (f" ({defaulted[key]})" if key in defaulted else "")
                     + ": the attention scores and softmax are kept for the backward, as costed")
        elif key == "flash_attention" and not value:
            raise _bad(f"use_flash_attention false: attention without flash attention is costed only on a Hugging "
                       f"Face config, and {args.spec} is not one", source)
        elif key == "window" and formats.is_config(args.spec):  # the attention the settings run
            extra["window"] = value
        elif key == "window" and value:
            raise _bad(f"--window-size: a sliding window is costed only on a Hugging Face config, and {args.spec} "
                       "is not one", source)
    if extra.get("dispatcher") == "flex" and (args.etp if args.etp is not None else args.tp or 1) > 1:
        del extra["dispatcher"]  # Megatron runs flex at ETP > 1 too; gpuknap costs it at ETP 1 only
        note("--moe-token-dispatcher-type flex at expert-tensor-parallel size over 1: costed as the alltoall "
             "dispatcher (gpuknap costs flex's once-per-node sends at ETP 1 only), every routed copy sent to its "
             "expert's rank, so across nodes the EP time is overstated")
    if etp_is_tp and args.etp is not None and args.etp != (args.tp or 1):  # arguments.py: ETP defaults to TP
        raise _bad(f"the settings give no --expert-tensor-parallel-size, so Megatron runs ETP = TP = {args.tp or 1}, "
                   f"but --etp {args.etp}; drop the flag or write the size in the file", source)
    if gbs is not None:  # Megatron: micro-batches = global batch / (micro-batch size x data-parallel size)
        per = (args.micro_batch_size or 1) * (args.dp or 1)
        if round_batch == "eval" and gbs % per and gbs >= per:  # --decrease-batch-size-if-needed: rounded down
            note(f"--decrease-batch-size-if-needed: Megatron runs a global batch of {gbs // per * per}, not {gbs} "
                 f"(a multiple of micro-batch size x data-parallel size, {per})")
            gbs = gbs // per * per
        if gbs % per:
            why = ("; --decrease-batch-size-if-needed would round it, but arguments.py first checks that the "
                   "evaluation batch (the global batch, without --eval-global-batch-size) divides"
                   if round_batch == "refused" else "")
            raise _bad(f"the global batch ({gbs_flag}: {gbs}) is not a multiple of micro-batch size x data-parallel "
                       f"size ({per}); "
                       f"Megatron refuses it{why}", source)
        if args.micro_batches is not None and args.micro_batches != gbs // per:
            raise _bad(f"the settings run {gbs // per} micro-batches (--global-batch-size {gbs}), but "
                       f"--micro-batches {args.micro_batches}", source)
        args.micro_batches = gbs // per
    return extra


def _even_plan(model: Any, name: str, stages: int, chunks: int, in_flight: Any, bucket: float, counts: Any,
               names: Any, score: str) -> tuple | None:
    """Megatron's even interleaved split with the best settings ``name`` expresses on it, when it
    fits and runs faster than the plan ``counts``/``names`` (by the run's time where there is one,
    as a sweep decides, else the simulated schedule's): ``(counts, names, score, that plan's
    simulated time, the even one's, its choice, both run times or None)``."""
    from ..search import best_on_split, even_candidate, even_is_faster, interleaved_score  # noqa: PLC0415

    even = even_candidate(model, stages, chunks, [counts])
    if even is None:
        return None
    even_names = best_on_split(model, even, name, chunks, in_flight, bucket)
    if even_names is None:
        return None
    gm = with_grouped(model)
    plans = [(list(counts), names), (even, even_names)]
    best_time, even_time = simulated_plans(gm, plans, chunks)
    runs = run_times(gm, plans, chunks)
    if not (even_is_faster(runs[1], runs[0]) if runs else even_is_faster(even_time, best_time)):
        return None  # as a sweep decides: by the run's time (sends and tails) where there is a run
    ev = framework.evaluate(gm, even, even_names, in_flight, chunks)
    value = float(interleaved_score(np.array([ev.times], dtype=np.float64), score, model.micro_batches, chunks)[0])
    return even, even_names, value, best_time, even_time, ev.choice, runs


def _window_notes(config: int | None, read: int | None, cp: int) -> list[str]:
    """What ``rank --from`` says when the attention window Megatron settings run (``read`` keys a
    query, 0 the whole sequence, None not said) is not the config's (``config``, None: none)."""
    if read is None:
        exchange = " with --cp-comm-type all_gather (Transformer Engine refuses a window over p2p)" if cp > 1 else ""
        return [] if config is None else [
            f"the config's {config}-token sliding window is costed; these flags do not set --window-size, without "
            f"which Megatron attends to the whole sequence (the window is --window-size {config - 1},0{exchange})"]
    if read == (config or 0):
        return []
    theirs = "the whole sequence" if not read else f"a {read}-token window (--window-size {read - 1},0)"
    ours = f"{config}-token sliding window" if config else "attention"
    return [f"costed as the settings run attention: {theirs}, not the config's {ours}"]


#: What every note on a Megatron file's data-parallel size starts with.
NO_DP = ("these Megatron settings do not give the data-parallel size (Megatron takes it from the world size, "
         "world / (TP x CP x PP))")


def rank_settings(args: argparse.Namespace, make_spec: Callable[..., Any], emit: Callable[[dict, str], None],
                  header: Callable[[Any], dict]) -> int:
    """``rank --from FILE``: score a framework's settings on the model, built as they run it."""
    source = args.settings
    if args.recompute is not None:
        raise ValueError(f"--recompute: {source} gives the recompute the run uses (none when it says nothing); "
                         "drop the flag, or change the settings")
    settings = formats.read_settings(source)
    try:  # what the settings say of the model's shape and experts is the model's
        formats.check_stated_model(settings, args.spec)
    except ValueError as exc:
        raise _bad(exc, source) from None
    args.stages = settings.stages
    run = getattr(settings, "run", {}) or {}
    if not formats.analytic(args.spec):  # measured options: only the micro-batches can come from the file
        if run.get("window"):
            raise _bad(f"--window-size: a sliding window is costed only on a Hugging Face config; {args.spec} gives "
                       "its layers' options as measured", source)
        if args.micro_batches is None and isinstance(run.get("micro_batches"), int):
            args.micro_batches = run["micro_batches"]
        spec = make_spec(args)
    else:
        unsaid = isinstance(settings, formats.megatron.Settings) and args.dp is None  # Megatron files never say DP
        stated = formats.stated_data_parallel(args.spec) if unsaid else None
        if stated is not None:  # a spec's transformer section (or its preset) gives it: the plan was made so
            args.dp = stated
            note(f"{NO_DP}: the spec's {stated} is used, as its plans were made; give --dp for another")
        extra = _merge(args, settings, source)
        spec = make_spec(args, **extra, **({"note_dp": False} if unsaid else {}))
        if unsaid and stated is None and spec.kind == "config":
            note(f"{NO_DP}: DP 1 assumed, so the optimizer state is not sharded and no gradients are reduced; "
                 "give --dp")
        if run.get("distributed_optimizer") is False and spec.model.costs.training.shards() > 1:
            raise _bad("the settings run without the distributed optimizer, and gpuknap's cost model shards the "
                       "optimizer over data-parallel ranks", source)
        tr = spec.model.costs.training
        if run.get("vocab_emb_dp") and tr.tp > 1 and "embedding" in spec.model.kind_order:
            raise _bad("parallel_config.vocab_emb_dp: with one pipeline stage MindFormers keeps the embedding and "
                       "output layer whole on every model-parallel rank unless it is False; gpuknap costs them split "
                       "over model_parallel: set vocab_emb_dp: False", source)
        moe = spec.model.costs.moe
        if (isinstance(settings, formats.megatron.Settings) and moe and tr.tp > 1
                and not tr.sequence_parallel):
            raise _bad("Megatron's MoE layers refuse tensor parallelism without --sequence-parallel (MoELayer.forward "
                       "raises when training so): add --sequence-parallel", source)
        if run.get("moe_dispatcher") in ("allgather", "default") and moe and tr.ep * tr.etp > 1:
            said = ("--moe-token-dispatcher-type allgather" if run["moe_dispatcher"] == "allgather" else
                    "without --moe-token-dispatcher-type, Megatron's default dispatcher, allgather "
                    "(transformer_config.py),")
            raise _bad(f"{said} all-gathers every token over the EP x ETP ranks and reduce-scatters the results; "
                       "gpuknap costs the alltoall dispatcher: write --moe-token-dispatcher-type alltoall", source)
        comm = run.get("cp_comm")
        if run.get("sliding") and spec.model.costs.training.cp > 1 and not (
                comm and all(t in formats.megatron.WINDOW_CP_COMM for t in comm)):
            used = f"--cp-comm-type {' '.join(comm)}" if comm else "Megatron's default p2p exchange"
            raise _bad(f"Transformer Engine runs a sliding window with context parallelism only over a2a or "
                       f"all_gather exchanges, and these settings use {used}: write --cp-comm-type all_gather "
                       "(gpuknap costs every exchange as the p2p ring's bytes)", source)
    model = with_grouped(spec.model)
    try:
        counts, names = settings.split(spec.model)
        ev = framework.evaluate(model, counts, names, spec.in_flight, settings.chunks)
    except ValueError as exc:
        raise _bad(exc, source) from None
    record = split_record(model, counts, ev.choice, "slowest", ev.slowest, spec.in_flight, settings.chunks)
    over = [s for s, (m, b) in enumerate(zip(ev.memory, ev.budgets)) if m > b]
    notes = list(getattr(settings, "notes", ()))
    read, costed = getattr(settings, "mtp", 0), formats.mtp_layers(args.spec)
    if read and costed and read != costed:
        raise _bad(f"the settings run {read} MTP layer(s) and the config has {costed} "
                   "(num_nextn_predict_layers), which gpuknap costs on the last stage; make them agree", source)
    if read and not costed:
        notes.append(f"{read} MTP layer(s) read; this model has none, so gpuknap does not cost them")
    tr = spec.model.costs.training if spec.model.costs is not None else None
    if run.get("overlap_grad_reduce") is False and tr is not None and max(tr.dp * tr.cp, tr.expert_data_parallel) > 1:
        notes.append("no --overlap-grad-reduce: Megatron then reduces the gradients after the last backward, all of "
                     "it exposed, and gathers the parameters before the next step; gpuknap costs both overlapped as "
                     "far as one micro-batch's backward and forward allow, a lower bound (add --overlap-grad-reduce "
                     "--overlap-param-gather)")
    if isinstance(settings, formats.megatron.Settings):
        cp = spec.model.costs.training.cp if spec.model.costs is not None else 1
        notes += _window_notes(formats.window_tokens(args.spec), run.get("window"), cp)
    if costed and not read:
        notes.append(f"the config's {costed} MTP layer(s) are costed on the last stage; these settings run none")
    payload = {**header(spec), "from": source, "feasible": not over, "over_budget_stages": over, "best": record,
               "notes": notes}
    verdict = ("fit every stage's budget" if not over else
               f"EXCEED the memory budget of stage(s) {', '.join(map(str, over))}")
    text = format_split(record, f"settings of {source}") + f"\nthese settings {verdict}"
    text += "".join(f"\nnote: {n}" for n in notes)
    emit(payload, text)
    return EXIT_OK if not over else EXIT_INFEASIBLE
