"""MindFormers settings: a plan's complete configuration, and configurations read back and scored.

MindFormers' ``LayerSetting`` (``mindformers/models/utils.py`` for legacy models,
``mindformers/parallel_core/training_graph/transformer/utils.py`` for mcore ones)
gives (virtual) stage s ``(num_layers + mtp) // (pp * v) + offset`` layers and,
within it, recomputes the **first** ``recompute`` layers fully, applies select
recompute (the MLP activation) to the first ``select_recompute`` layers and comm
recompute (the norms) to the first ``select_comm_recompute``.  SAPP-PPB's
options are those: ``recompute`` = FULL, ``select_recompute`` = SLCT + BOTH +
FULL, ``select_comm_recompute`` = COMM + BOTH + FULL.  gpuknap's cost model's
SLCT is Megatron's core attention, not MindFormers' select recompute, so a
cost-modelled plan is written with FULL and NONE only.

:func:`dump` writes ``parallel_config`` (data, model, context, expert parallel,
pipeline stages, micro-batches, sequence parallelism), ``runner_config.batch_size``,
``parallel`` (the optimizer sharding; ``pipeline_config.pipeline_interleave``
for interleaved plans), ``model.model_config`` (layers, sequence, MTP depth,
offsets, interleaving, and the select lists mcore models read there) and
``recompute_config`` (the lists legacy models read).  A plan MindFormers'
first-layers rule cannot run is written with each stage's closest setting, with
a comment per stage.  Reading back is :mod:`._mindformers_read`.
"""
from __future__ import annotations

import json
from typing import Any

from ..search import best_on_split, with_grouped
from ._mindformers_read import EXCLUSIVE, TYPES, Settings, load, runs
from .framework import DECODER, FrameworkPlan, evaluate, mismatches, roles

__all__ = ["EXCLUSIVE", "TYPES", "Settings", "dump", "load", "runs", "settings"]

def _counts(plan: FrameworkPlan, names: Any) -> tuple:
    """Per segment: decoder layers and the three counts (names in the first-layers order)."""
    recompute, select, comm = [], [], []
    role, start = roles(plan.model), 0
    for n in plan.counts:
        dec = [names[j] for j in range(start, start + n) if role[j] == DECODER]
        full, both = dec.count("FULL"), dec.count("BOTH")
        recompute.append(full)
        select.append(full + both + dec.count("SLCT"))
        comm.append(full + both + dec.count("COMM"))
        start += n
    return tuple(recompute), tuple(select), tuple(comm)


def settings(plan: FrameworkPlan) -> tuple[Settings, Any]:
    """The MindFormers settings of a plan and None when they run it exactly, else each stage's closest
    setting and its :class:`~gpuknap.formats.framework.Evaluation`."""
    if not isinstance(plan, FrameworkPlan):
        raise ValueError(f"plan: expected a FrameworkPlan (gpuknap.formats.framework.framework_plan), "
                         f"got {type(plan).__name__}")
    if plan.model is None:
        raise ValueError("plan: made without its model (make it with framework.framework_plan)")
    model, names, ev = plan.model, list(plan.names), None
    decoders = tuple(seg.decoders for seg in plan.segments)
    st = Settings(plan.stages, plan.chunks, plan.decoder_layers, decoders, *_counts(plan, names), plan.mtp)
    exact = set(plan.option_names()) <= set(runs(model))
    if exact:
        _, ran = st.split(model)
        exact = not mismatches(model, plan.counts, plan.names, ran, plan.chunks)
    if not exact:  # each stage's fastest setting MindFormers runs on this split, scored
        names = best_on_split(model, plan.counts, "mindformers", plan.chunks, plan.in_flight)
        if names is None:
            raise ValueError("no MindFormers setting fits every stage of this split, not even full recompute")
        st = Settings(plan.stages, plan.chunks, plan.decoder_layers, decoders, *_counts(plan, names), plan.mtp)
        ev = evaluate(with_grouped(model), plan.counts, st.split(model)[1], plan.in_flight, plan.chunks)
    return st, ev


def _lists(values: tuple, stages: int, chunks: int) -> Any:
    rows = [list(values[c * stages:(c + 1) * stages]) for c in range(chunks)]
    return rows[0] if chunks == 1 else rows


def dump(plan: FrameworkPlan) -> str:
    """The configuration keys of a plan, as YAML to merge into a MindFormers configuration."""
    st, ev = settings(plan)
    run, p, v = plan.run, st.stages, st.chunks
    total = st.num_layers + st.mtp
    layers = list(st.decoders)
    layers[-1] += st.mtp  # MTP layers are the last layer ids: the last (virtual) stage holds them
    base = total // (p * v)
    offset = tuple(n - base for n in layers)
    if run is not None and run.moe_without_sp:
        raise ValueError("sequence_parallel: MindFormers refuses MoE layers with model_parallel > 1 without "
                         "use_seq_parallel (tools/check_rules.py)")
    # The experts' tensor parallelism: legacy models split the experts over model_parallel, or over
    # moe_config.expert_model_parallel when it is 1 (llama_layer.py refuses other values); mcore models
    # never split them over model_parallel (moe/ffn.py, FFNGroupedGEMM.shard: ETP 1) and skip moe_config
    # (template.py).  With ETP 1 the block writes expert_model_parallel: 1 and both run the plan; with
    # ETP = TP > 1 only legacy models do, and a comment says so.
    if run is not None and run.moe and run.etp not in (1, run.tp):
        raise ValueError(f"expert_tensor_parallel: MindFormers splits the experts over model_parallel ({run.tp}) or "
                         f"not at all (moe_config.expert_model_parallel: 1; llama_layer.py refuses other values); the "
                         f"plan assumed {run.etp}: plan with --etp 1 or --etp equal to --tp")
    if run is not None and run.moe and run.dispatcher == "flex" and run.ep > 1:
        raise ValueError("dispatcher: the plan sends each token once per node as Megatron's flex dispatcher (DeepEP, "
                         "HybridEP) does, which MindFormers' settings do not state; plan with --dispatcher alltoall")
    if run is not None and run.tp_comm_overlap and run.tp > 1:
        raise ValueError("tp_comm_overlap: the plan hides TP communication behind the GEMMs as Megatron's "
                         "--tp-comm-overlap does, which MindFormers' settings cannot state; plan without it")

    def show(values: tuple) -> str:
        return json.dumps(_lists(values, p, v))

    lines = [f"# gpuknap plan for {plan.name}: {p} pipeline stage{'' if p == 1 else 's'}" + (f" x {v} chunks" if v > 1 else "")
             + f", {st.num_layers} decoder layers" + (f" + {st.mtp} MTP" if st.mtp else "")
             + (f", score {plan.score:.6g}" if plan.score is not None else "")]
    lines += [f"# {note}" for note in plan.notes]
    lines.append("# merge these keys into your MindFormers configuration: legacy models read the recompute lists "
                 "in recompute_config, mcore models (use_legacy: False) the select lists in model_config on r1.6; "
                 "on r1.7 and later mcore models read them in recompute_config: delete model_config's select_recompute "
                 "and select_comm_recompute there (they refuse both)")
    if run is not None:
        lines.append(f"# runs on {run.gpus} NPUs/GPUs: data_parallel x model_parallel x context_parallel x "
                     "pipeline_stage" + (f"; gpuknap assumed expert tensor parallelism {run.etp}" if run.moe else ""))
    else:
        lines.append("# the profile was measured: keep the parallel sizes, batch and sequence it was measured with")
    if run is not None and run.moe and run.etp == run.tp > 1:
        lines.append(f"# the experts split over model_parallel ({run.tp}), as legacy models run them; mcore models "
                     "(use_legacy: False) split them over expert_parallel only (moe/ffn.py): plan with --etp 1 "
                     "for them")
    if ev is not None:
        lines += _closest_comments(plan, st, ev)
    parallel = ([f"  enable_parallel_optimizer: {run.distributed_optimizer}"] if run is not None else [])
    if v > 1:
        parallel += ["  pipeline_config:", "    pipeline_interleave: True", "    pipeline_scheduler: 1f1b"]
    lines += (["parallel:"] + parallel) if parallel else []
    lines.append("parallel_config:")
    if run is not None:
        lines += [f"  data_parallel: {run.dp}", f"  model_parallel: {run.tp}", f"  context_parallel: {run.cp}"]
        lines += [f"  expert_parallel: {run.ep}"] if run.moe else []
        lines.append(f"  use_seq_parallel: {run.sequence_parallel and run.tp > 1}")
        # the embedding and output layer split over model_parallel, as costed (MindFormers sets it
        # false itself only with more than one stage: core/parallel_config.py)
        lines += ["  vocab_emb_dp: False"] if "embedding" in plan.model.kind_order else []
    # one stage: MindFormers resets micro_batch_num to 1 and accumulates gradient_accumulation_steps
    # micro-batches instead (trainer/base_trainer.py)
    lines += [f"  pipeline_stage: {p}", f"  micro_batch_num: {plan.model.micro_batches if p > 1 else 1}"]
    if run is not None or p == 1:
        lines += ["runner_config:"] + ([f"  batch_size: {run.micro_batch}"] if run is not None else [])
        lines += [f"  gradient_accumulation_steps: {plan.model.micro_batches}"] if p == 1 else []
    if run is not None and run.moe and run.etp == 1 and run.tp > 1:  # legacy models read it (llama_layer.py)
        lines += ["moe_config:", "  expert_model_parallel: 1"]
    lines += ["model:", "  model_config:", f"    num_layers: {st.num_layers}"]
    if run is not None:
        lines.append(f"    seq_length: {run.seq}")
        # the attention costed; legacy models default to False, and context parallelism needs it True
        lines.append(f"    use_flash_attention: {run.flash_attention}")
    lines += [f"    mtp_depth: {st.mtp}"] if st.mtp else []
    lines.append(f"    offset: {show(offset)}")
    lines += [f"    pp_interleave_num: {v}"] if v > 1 else []
    lines += [f"    select_recompute: {show(st.select)}", f"    select_comm_recompute: {show(st.comm)}",
              "recompute_config:", f"  recompute: {show(st.recompute)}", f"  select_recompute: {show(st.select)}",
              f"  select_comm_recompute: {show(st.comm)}"]
    return "\n".join(lines) + "\n"


def _closest_comments(plan: FrameworkPlan, st: Settings, ev: Any) -> list[str]:
    out = ["# MindFormers recomputes the first layers of each stage and runs " + ", ".join(runs(plan.model))
           + "; these settings do not run the plan exactly:",
           "# each stage's fastest setting that fits: slowest stage " + f"{ev.slowest:.6g}"]
    for i, seg in enumerate(plan.segments):
        c, s = divmod(i, plan.stages)
        wants = " ".join(f"{n}x{k}" for n, k in seg.options) or "no decoder layers"
        where = f"stage {s}" + (f" chunk {c}" if plan.chunks > 1 else "")
        gets = " ".join(f"{n}x{st.types(i).count(n)}" for n in TYPES if n in st.types(i))
        after = ""
        if c == plan.chunks - 1:
            fits = "fits" if ev.memory[s] <= ev.budgets[s] else "OVER budget"
            after = (f"; the stage takes {ev.times[s]:.6g}, "
                     f"{ev.memory[s] / 2**20:,.0f} / {ev.budgets[s] / 2**20:,.0f} MiB ({fits})")
        out.append(f"#   {where}: the plan wants {wants}, these run {gets or 'no decoder layers'}{after}")
    return out
