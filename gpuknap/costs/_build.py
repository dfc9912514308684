"""From a shape, a training run and a device to a :class:`PipelineModel` whose options cost time and
memory as docs/costs.md derives, plus what the model needs beyond its options (:class:`ModelCosts`).

Options of a dense decoder layer: ``NONE`` (keep every activation), ``SLCT`` (recompute the
attention core: Megatron's ``core_attn``), ``FULL`` (recompute the whole layer, keep its
input); a MoE layer adds ``MOEACT`` (recompute the routed experts' activation function:
Megatron's ``moe_act``) and ``SLCT+MOEACT``.  Times are in milliseconds, each option's
``parts`` splitting its forward plus backward time into compute, recompute and the
communication of tensor (``tp``), context (``cp``) and expert (``ep``) parallelism.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

from ..engine import LayerOption
from ..search import PipelineModel
from ._arch import Architecture
from ._comm import Training, all_gather, links, send
from ._devices import Device
from ._layers import ACT, FP32, LayerCost, layer_cost

MS = 1e3
#: Parameters per gradient bucket of Megatron's distributed data parallel (its default bucket size).
BUCKET_PARAMS = 40_000_000
#: Bytes an Adam step streams per parameter: fp32 gradient, master weight and two moments read,
#: the three written back, and the 16-bit weight written.
ADAM_BYTES = 30


@dataclass(frozen=True)
class ModelCosts:
    """What a cost-modelled :class:`PipelineModel` knows beyond its options (times in ms):
    ``flops[kind]`` Megatron's model FLOPs of one layer for one micro-batch (forward and
    backward, no recompute), ``params[kind]``/``expert_params[kind]`` per rank, ``p2p`` one
    micro-batch's activations sent to the next stage, ``mtp`` the multi-token-prediction layers
    costed with the output layer, ``window`` and ``flash_attention`` the attention costed."""

    device: Device
    training: Training
    micro_batches: int
    flops: Mapping = field(default_factory=dict)
    params: Mapping = field(default_factory=dict)
    expert_params: Mapping = field(default_factory=dict)
    p2p: float = 0.0
    time_unit: float = 1e-3
    window: int | None = None
    mtp: int = 0
    flash_attention: bool = True

    @property
    def moe(self) -> bool:
        """Whether the model has MoE layers (expert parameters), whatever options a fixed recompute
        left them."""
        return any(v > 0 for v in self.expert_params.values())

    def tail(self, kinds: Mapping, forward: float, backward: float) -> float:
        """Time after a stage's last backward (ms): the exposed part of the data-parallel gradient
        reduce-scatter and parameter all-gather, then the optimizer step.  ``kinds``: the stage's
        layers per kind; ``forward``/``backward``: one micro-batch's forward and backward time on the
        stage (ms), the only computation Megatron overlaps them with (:func:`exposed`)."""
        tr, dev = self.training, self.device
        dense = sum(n * self.params.get(k, 0.0) for k, n in kinds.items())
        expert = sum(n * self.expert_params.get(k, 0.0) for k, n in kinds.items())
        grads = gather = buckets = last_grads = last_gather = 0.0
        for count, link, size in _reduced(dense, expert, tr, dev):
            k = math.ceil(count / BUCKET_PARAMS)
            one_grads, one_gather = all_gather(FP32 * count / k, size, link), all_gather(ACT * count / k, size, link)
            grads, gather, buckets = grads + k * one_grads, gather + k * one_gather, buckets + k
            last_grads, last_gather = max(last_grads, one_grads), max(last_gather, one_gather)
        # dense and expert gradients fill buffers of their own: each one's last bucket is ready only
        # when the backward ends, so the larger of the two is left at least
        out = exposed(grads, buckets, backward / MS, last_grads) + exposed(gather, buckets, forward / MS, last_gather)
        return (out + _adam_seconds(dense, expert, tr, dev)) * MS

    def tail_seconds(self, kinds: Mapping, stages: int, data_parallel: int) -> float:
        """What the tails of any split of the layers ``kinds`` (counted per kind) over ``stages``
        stages with ``data_parallel`` replicas add up to at least before overlap (ms): every
        stage's gradient reduce-scatter and parameter all-gather, their ring latencies counted for
        a fractional number of buckets (a stage's whole number of buckets is at least its
        parameters over :data:`BUCKET_PARAMS`, so the sum over stages is at least this), and its
        optimizer step.  The embedding and output layers are left out (their parameters depend on
        the stage count through a tied embedding).  A stage's tail is at least its share of this
        minus its one-micro-batch forward and backward (:meth:`tail`), so sweeps bound iteration
        times with it."""
        shares = self.tail_shares(kinds, stages, data_parallel)
        return sum(n * shares[kind] for kind, n in kinds.items())

    def tail_shares(self, kinds: Any, stages: int, data_parallel: int) -> dict:
        """Each kind's one layer's share of :meth:`tail_seconds` (ms; 0 for the embedding and
        output layers, and for every kind when the sizes do not make a valid run)."""
        out = dict.fromkeys(kinds, 0.0)
        try:
            tr = replace(self.training, data_parallel=data_parallel, pipeline_parallel=stages)
        except ValueError:
            return out
        dev = self.device
        for kind in out:
            if kind in ("embedding", "output"):
                continue
            dense, expert, total = self.params.get(kind, 0.0), self.expert_params.get(kind, 0.0), 0.0
            for count, link, size in _reduced(dense, expert, tr, dev):
                total += (size - 1) / size * (FP32 + ACT) * count / link.bandwidth
                total += 2 * (size - 1) * link.latency * count / BUCKET_PARAMS
            out[kind] = (total + _adam_seconds(dense, expert, tr, dev)) * MS
        return out

    def model_flops(self, kinds: Mapping) -> float:
        """Model FLOPs of an iteration over the whole cluster for layers counted per kind."""
        per_replica = sum(n * self.flops.get(k, 0.0) for k, n in kinds.items())
        return per_replica * self.micro_batches * self.training.dp


def parallel_problems(arch: Architecture, tr: Training) -> Iterator[tuple]:
    """The rules Megatron applies to parallel sizes for this shape that these sizes break, in order,
    as data for the caller's words: ``("divides", group, size, dim, value)`` (``group`` of ``tp``,
    ``ep``, ``etp`` does not divide ``dim`` of ``heads``, ``ffn``, ``experts``, ``expert_ffn``,
    ``shared_ffn``), ``("kv",)`` (KV heads neither split nor replicated evenly over TP),
    ``("dense_experts",)`` (expert parallelism on a dense model), ``("flex_etp",)`` (the flex
    dispatcher at ETP over 1), ``("stage_ranks",)`` (EP x ETP not dividing TP x CP x DP) and
    ``("sequence", why)`` (:meth:`Training.sequence_rule`)."""
    t = tr.tp
    if arch.heads % t:
        yield "divides", "tp", t, "heads", arch.heads
    if arch.latent is None and arch.kv % t and t % arch.kv:
        yield ("kv",)
    if arch.ffn and not all(arch.moe_layers or [False]) and arch.ffn % t:
        yield "divides", "tp", t, "ffn", arch.ffn
    e = arch.experts
    if e is None and (tr.ep != 1 or tr.etp != t):
        yield ("dense_experts",)
    elif e is not None:
        for group, size, dim, value in (("ep", tr.ep, "experts", e.experts), ("etp", tr.etp, "expert_ffn", e.ffn)):
            if value % size:
                yield "divides", group, size, dim, value
        if tr.dispatcher == "flex" and tr.etp > 1:
            yield ("flex_etp",)
        if e.shared_ffn and e.shared_ffn % t:
            yield "divides", "tp", t, "shared_ffn", e.shared_ffn
        if tr.stage_ranks % (tr.ep * tr.etp):
            yield ("stage_ranks",)
    rule = tr.sequence_rule()
    if rule:
        yield "sequence", rule


#: How :func:`check_run` names :func:`parallel_problems`' groups and dimensions.
_FIELDS = {"tp": "tensor_parallel", "ep": "expert_parallel", "etp": "expert_tensor_parallel", "heads": "heads",
           "ffn": "ffn", "experts": "experts.experts", "expert_ffn": "experts.ffn", "shared_ffn": "experts.shared_ffn"}


def check_run(arch: Architecture, tr: Training, device: Device) -> None:
    """Refuse (ValueError naming the field) arguments of the wrong type and the first of
    :func:`parallel_problems`."""
    for name, value, kind in (("arch", arch, Architecture), ("tr", tr, Training), ("device", device, Device)):
        if not isinstance(value, kind):
            raise ValueError(f"{name} must be a gpuknap.costs.{kind.__name__}, got {type(value).__name__}")
    problem = next(parallel_problems(arch, tr), None)
    if problem is None:
        return
    kind, *data = problem
    if kind == "divides":
        group, size, dim, value = data
        raise ValueError(f"tr.{_FIELDS[group]}={size} does not divide arch.{_FIELDS[dim]}={value}")
    raise ValueError({
        "kv": f"arch.kv_heads: {arch.kv} KV heads cannot be split or replicated evenly over "
              f"tr.tensor_parallel={tr.tp}",
        "dense_experts": f"tr.expert_parallel={tr.ep}, expert_tensor_parallel={tr.etp}: expert parallelism "
                         "applies to MoE models only (arch.experts is None)",
        "flex_etp": f"tr.dispatcher: the flex dispatcher is costed at expert_tensor_parallel=1, got {tr.etp}",
        "stage_ranks": f"tr.expert_parallel x expert_tensor_parallel = {tr.ep * tr.etp} must divide the "
                       f"{tr.stage_ranks} ranks of a pipeline stage (TP x CP x DP)",
        "sequence": f"tr: {data[0] if data else ''}"}[kind])


def _reduced(dense: float, expert: float, tr: Training, device: Device) -> list[tuple]:
    """``(parameters, links, ranks)`` of each data-parallel group that reduces gradients: dense
    weights over DP x CP, expert weights over their expert-data-parallel group."""
    return [(count, links(device, tr, group), size)
            for count, group, size in ((dense, "dpcp", tr.dp * tr.cp), (expert, "edp", tr.expert_data_parallel))
            if count and size > 1]


def _adam_seconds(dense: float, expert: float, tr: Training, device: Device) -> float:
    """The optimizer step of a rank's shard of ``dense`` and ``expert`` parameters (seconds)."""
    return device.memory_seconds(ADAM_BYTES * (dense / tr.shards() + expert / max(tr.expert_data_parallel, 1)))


def exposed(comm: float, buckets: float, window: float, last: float = 0.0) -> float:
    """Seconds of ``comm``, sent in ``buckets`` buckets, left over after a computation of
    ``window`` seconds that readies the buckets at an even pace: the last bucket at least (it is
    ready only when the computation ends; ``last``, when the buckets differ, else their mean), and
    all that does not fit beside the computation."""
    if comm <= 0 or buckets <= 0:
        return 0.0
    return max(comm / buckets, last, comm - window * (buckets - 1) / buckets)


def options(cost: LayerCost, device: Device) -> list[LayerOption]:
    """The recompute options of one layer."""
    mm, mem = device.matmul_seconds, device.memory_seconds
    compute_f = mm(cost.matmul) + mem(cost.stream)
    comm_f = cost.tp_forward + cost.cp_forward + cost.ep_forward
    fwd = compute_f + comm_f
    bwd = 2 * compute_f + cost.tp_backward + cost.cp_backward + cost.ep_backward
    base = {"compute": 3 * compute_f, "tp": cost.tp_forward + cost.tp_backward,
            "cp": cost.cp_forward + cost.cp_backward, "ep": cost.ep_forward + cost.ep_backward}
    core = mm(cost.core) + mem(cost.core_stream) + cost.cp_forward
    act = mem(cost.act_stream)
    kinds = [("NONE", cost.activations, {}),
             ("SLCT", cost.activations - cost.core_activations, {"recompute": core})]
    if cost.moe:
        kinds += [("MOEACT", cost.activations - cost.act_outputs, {"recompute": act}),
                  ("SLCT+MOEACT", cost.activations - cost.core_activations - cost.act_outputs,
                   {"recompute": core + act})]
    kinds.append(("FULL", cost.layer_input, {"recompute": compute_f, "tp": cost.tp_forward,
                                             "cp": cost.cp_forward, "ep": cost.ep_forward}))
    out = []
    for name, memory, extra in kinds:
        parts = {k: v + extra.get(k, 0.0) for k, v in base.items()}
        parts["recompute"] = extra.get("recompute", 0.0)
        added = sum(extra.values())
        out.append(LayerOption(name, memory, fwd * MS, (bwd + added) * MS,
                               parts=tuple((k, v * MS) for k, v in parts.items() if v)))
    return out


def static_bytes(params: float, expert_params: float, tr: Training) -> float:
    """Weights, gradients and optimizer state of parameters held by one rank."""
    edp = tr.expert_data_parallel if tr.distributed_optimizer else 1
    return (params * (tr.param_bytes + tr.optimizer_bytes / tr.shards())
            + expert_params * (tr.param_bytes + tr.optimizer_bytes / edp))


def _head_tail(arch: Architecture, tr: Training, device: Device) -> tuple:
    """Options, static bytes and model FLOPs of the embedding (HEAD) and the output layer with its
    loss (TAIL): the output's fp32 logits are kept for one micro-batch (the last stage runs its
    backward at once), the embedding's output for every micro-batch in flight."""
    s, b, h, t, c, v = tr.seq, tr.micro_batch, arch.hidden, tr.tp, tr.cp, arch.vocab
    n = s * b / c
    held = n / t if tr.sequence_parallel else n
    full = ACT * n * h
    comm = all_gather(full, t, links(device, tr, "tp")) if t > 1 else 0.0
    head_mem = ACT * held * h + (held * h if arch.dropout else 0.0)
    head = LayerOption("HEAD", head_mem, comm * MS, comm * MS, parts=(("tp", 2 * comm * MS),) if comm else ())
    logits = 2 * n * h * v / t
    compute = device.matmul_seconds(logits) + device.memory_seconds((ACT + 2 * FP32) * n * v / t)
    tail_comm = (comm, 2 * comm)
    tail = LayerOption("TAIL", 2 * ACT * held * h, (compute + tail_comm[0]) * MS,
                       (2 * compute + tail_comm[1]) * MS, held_once=FP32 * n * v / t,
                       parts=tuple((k, x * MS) for k, x in (("compute", 3 * compute), ("tp", sum(tail_comm))) if x))
    params = v * h / t
    norm = (2 if arch.layernorm else 1) * h
    return head, tail, params, norm, 3 * 2 * s * b * h * v


def _mtp(arch: Architecture, tr: Training, device: Device, tail: LayerOption, cost: LayerCost) -> tuple:
    """The TAIL with Megatron-Core's multi-token-prediction block after it (on the last stage, as
    Megatron places it), and the block's parameters, expert parameters and model FLOPs.  Per
    depth: two RMSNorms (of the embedded shifted tokens and of the hidden states), ``eh_proj``
    (2h -> h, column-parallel), one transformer layer of the model's last-layer kind (``cost``,
    its activations all kept), a final norm and a second pass through the shared output layer:
    its logits, fp32, kept with the main ones.  With P > 1 the last stage also holds a copy of an
    untied embedding (the shifted tokens are embedded there)."""
    s, b, h, t, c, v, k = tr.seq, tr.micro_batch, arch.hidden, tr.tp, tr.cp, arch.vocab, arch.mtp
    n = s * b / c
    held = n / t if tr.sequence_parallel else n
    mm, mem = device.matmul_seconds, device.memory_seconds
    norm = (2 if arch.layernorm else 1) * h
    proj = 2 * h * h / t
    logits = mm(2 * n * h * v / t) + mem((ACT + 2 * FP32) * n * v / t)
    layer_f = mm(cost.matmul) + mem(cost.stream)
    compute = layer_f + mm(2 * n * proj) + mem(3 * 4 * held * h) + logits  # norms stream 4 bytes an element
    extra_f = 2 * all_gather(ACT * n * h, t, links(device, tr, "tp")) if t > 1 else 0.0  # eh_proj, logits' input
    comm_f = cost.tp_forward + cost.cp_forward + cost.ep_forward + extra_f
    comm_b = cost.tp_backward + cost.cp_backward + cost.ep_backward + 2 * extra_f
    # eh_proj's input (2h wide, its TP shard with SP); three norms' inputs and the output layer's
    kept = cost.activations + ACT * (2 * n * h / t if tr.sequence_parallel else 2 * n * h) + ACT * 4 * held * h
    parts = dict(tail.parts)
    for name, x in (("compute", 3 * compute), ("tp", cost.tp_forward + cost.tp_backward + 3 * extra_f),
                    ("cp", cost.cp_forward + cost.cp_backward), ("ep", cost.ep_forward + cost.ep_backward)):
        if x:
            parts[name] = parts.get(name, 0.0) + k * x * MS
    option = LayerOption("TAIL", tail.per_micro_batch + k * kept, tail.forward_time + k * (compute + comm_f) * MS,
                         tail.backward_time + k * (2 * compute + comm_b) * MS,
                         held_once=tail.held_once * (1 + k), parts=tuple(parts.items()))
    params = k * (cost.params + proj + 3 * norm) + (v * h / t if tr.pp > 1 and not arch.tied else 0.0)
    flops = k * 3 * (cost.model_flops + 2 * s * b * 2 * h * h + 2 * s * b * h * v)
    return option, params, k * cost.expert_params, flops


def build(arch: Architecture, tr: Training, device: Device, capacity: float, micro_batches: int,
          reserved: float) -> PipelineModel:
    """The :class:`PipelineModel` of a transformer (kinds ``embedding``, ``dense``, ``moe``,
    ``output``; without a vocabulary only the decoder layers), with its :class:`ModelCosts`.
    Sizes Megatron would refuse (:func:`check_run`) are refused."""
    check_run(arch, tr, device)
    moe = [arch.is_moe(i) for i in range(arch.layers)]
    fronts, static, flops, params, expert = {}, {}, {}, {}, {}
    costs_of = {}
    for kind, is_moe in (("dense", False), ("moe", True)):
        if is_moe in moe:
            cost = costs_of[is_moe] = layer_cost(arch, tr, device, is_moe)
            fronts[kind] = options(cost, device)
            static[kind] = static_bytes(cost.params, cost.expert_params, tr)
            flops[kind] = 3 * cost.model_flops
            params[kind], expert[kind] = cost.params, cost.expert_params
    kinds = ["moe" if m else "dense" for m in moe]
    if arch.vocab:
        head, tail, vocab_params, norm, logit_flops = _head_tail(arch, tr, device)
        fronts["embedding"], fronts["output"] = [head], [tail]
        # a tied matrix is one parameter on one stage; with P > 1 the first and last stages each
        # hold a copy (Megatron's shared embedding, its gradients all-reduced between the two)
        output_params = norm if arch.tied and tr.pp == 1 else vocab_params + norm
        mtp_expert = 0.0
        if arch.mtp:
            tail, mtp_params, mtp_expert, mtp_flops = _mtp(arch, tr, device, tail, costs_of[moe[-1]])
            output_params, logit_flops = output_params + mtp_params, logit_flops + mtp_flops
            fronts["output"] = [tail]
        static["embedding"] = static_bytes(vocab_params, 0.0, tr)
        static["output"] = static_bytes(output_params, mtp_expert, tr)
        params["embedding"], params["output"] = vocab_params, output_params
        expert["output"] = mtp_expert
        flops["embedding"], flops["output"] = 0.0, logit_flops
        kinds = ["embedding"] + kinds + ["output"]
    p2p = 0.0
    if tr.pp > 1:
        activation = ACT * tr.seq * tr.micro_batch / tr.cp * arch.hidden
        p2p = send(activation / tr.tp if tr.sequence_parallel else activation, links(device, tr, "pp")) * MS
    costs = ModelCosts(device, tr, micro_batches, flops, params, expert, p2p, window=arch.window,
                       mtp=arch.mtp if arch.vocab else 0, flash_attention=arch.flash_attention)
    return PipelineModel(kinds, fronts, static, capacity, micro_batches, reserved, costs=costs)


#: ``--recompute`` values and the option each decoder kind then runs.
RECOMPUTE = {"none": "NONE", "selective": "SLCT", "full": "FULL", "moe_act": "MOEACT",
             "selective+moe_act": "SLCT+MOEACT"}
#: What a dense layer runs for a MoE-only option (Megatron's ``moe_act`` leaves dense MLPs alone).
_DENSE = {"MOEACT": "NONE", "SLCT+MOEACT": "SLCT"}


def fixed(model: PipelineModel, recompute: str | Mapping, where: str = "") -> PipelineModel:
    """The model with every decoder layer's option fixed, to predict a run as it was run:
    ``recompute`` is ``none``, ``selective`` or ``full`` for every decoder kind, ``moe_act`` or
    ``selective+moe_act`` (Megatron's ``--recompute-modules moe_act`` and ``core_attn moe_act``:
    MoE layers ``MOEACT`` or ``SLCT+MOEACT``, dense layers ``NONE`` or ``SLCT``), or a mapping
    from kind to an option name (kinds not named keep their options).  ``where`` (a file) begins
    every error message."""
    try:
        return _fixed(model, recompute)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if where else str(exc)) from None


def _fixed(model: PipelineModel, recompute: str | Mapping) -> PipelineModel:
    """:func:`fixed` without its file."""
    if isinstance(recompute, str):
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        option = RECOMPUTE[recompute]
        decoder = [kind for kind in model.kind_order if kind not in ("embedding", "output")]
        moe = [kind for kind in decoder if any(getattr(o, "name", None) == option for o in model.fronts[kind])]
        if option in _DENSE and not moe:
            raise ValueError(f"recompute (--recompute): {recompute!r} recomputes the experts' activation function, "
                             "and the model has no MoE layers")
        wanted = {kind: option if kind in moe else _DENSE.get(option, option) for kind in decoder}
    elif isinstance(recompute, Mapping):
        wanted = dict(recompute)
    else:
        raise ValueError(f"recompute must be a name or a mapping from kind to option name, got {recompute!r}")
    fronts = dict(model.fronts)
    for kind, name in wanted.items():
        if kind not in fronts:
            raise ValueError(f"recompute: the model has no layer kind {kind!r}; kinds: {list(model.kind_order)}")
        chosen = [o for o in fronts[kind] if getattr(o, "name", None) == name]
        if not chosen:
            names = [getattr(o, "name", o) for o in fronts[kind]]
            raise ValueError(f"recompute: kind {kind!r} has no option {name!r}; its options: {names}")
        fronts[kind] = chosen
    return PipelineModel(model.kinds, fronts, model.static, model.capacity, model.micro_batches, model.reserved,
                         costs=model.costs)
