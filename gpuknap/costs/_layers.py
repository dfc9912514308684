"""What one decoder layer costs on one rank for one micro-batch, module by module.

Counted per rank (docs/costs.md, "A layer, module by module", derives each term):
parameters held (expert parameters apart), forward matrix FLOPs, bytes streamed by
memory-bound kernels, bytes of activations kept for the backward pass, and the
seconds of tensor-, context- and expert-parallel communication in the forward
and the backward pass.  With Korthikanti et al.'s assumptions (multi-head
attention, a 4h GeLU MLP, dropout, no flash attention, 16-bit activations) the
activations are their ``sbh(34/t + 5as/(ht))`` with sequence parallelism and
``sbh(10 + 24/t + 5as/(ht))`` without.

Notation: ``s`` sequence, ``b`` micro-batch size, ``h`` hidden, ``t`` TP, ``c`` CP,
``n = s*b/c`` tokens a rank's matrices see (its CP shard, all-gathered over TP),
``n_sp = n/t`` tokens a rank holds between blocks with sequence parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass

from ._arch import Architecture
from ._comm import Training, all_gather, all_reduce, all_to_all_across, flex_dispatch, links
from ._devices import Device

#: Bytes of a 16-bit activation value; of an fp32 one.
ACT, FP32 = 2, 4


@dataclass(frozen=True)
class LayerCost:
    """One decoder layer on one rank for one micro-batch (see the module docstring).

    Times in seconds; ``*_forward``/``*_backward`` are communication.  ``core`` parts are the
    attention core's (recomputed by selective recompute), ``act`` parts the routed experts'
    activation function's (recomputed by ``moe_act``)."""

    params: float
    expert_params: float
    matmul: float
    core: float
    stream: float
    core_stream: float
    act_stream: float
    activations: float
    core_activations: float
    act_outputs: float
    layer_input: float
    tp_forward: float
    tp_backward: float
    cp_forward: float
    cp_backward: float
    ep_forward: float
    ep_backward: float
    model_flops: float
    moe: bool = False


def _norm_params(arch: Architecture) -> float:
    return (2 if arch.layernorm else 1) * arch.hidden


def attention(arch: Architecture, tr: Training, device: Device) -> dict:
    """The attention block (its input norm included): per-rank parameters, FLOPs, bytes, comm."""
    s, b, h, t, c = tr.seq, tr.micro_batch, arch.hidden, tr.tp, tr.cp
    n = s * b / c
    held = n / t if tr.sequence_parallel else n  # tokens a rank keeps between blocks
    a = arch.heads / t  # query heads per rank
    out: dict = {"params_whole": _norm_params(arch), "extra_act": 0.0}
    if arch.latent is None:
        d, kv = arch.d, max(arch.kv / t, 1.0)  # K/V heads per rank: replicated when TP > KV heads
        q_params, kv_params = h * a * d, 2 * h * kv * d
        out["params"] = 2 * q_params + kv_params  # Q, O split over TP; K, V per rank
        out["matmul"] = 2 * n * (2 * q_params + kv_params)
        out["model_flops"] = 2 * s * b * h * d * (2 * arch.heads + 2 * arch.kv)
        qk, v = d, d
        kept = ACT * n * (a * d + 2 * kv * d + a * d)  # Q, K, V, output-projection input
        if arch.qkv_bias:  # split over TP like the weights
            out["params"] += a * d + 2 * kv * d
        if arch.qk_norm:  # one RMSNorm weight per head dimension for Q and one for K; their inputs kept
            out["params_whole"] += 2 * d
            kept += ACT * n * (a + kv) * d
            out["extra_stream"] = 4 * n * (a + kv) * d  # read and write Q and K once more (2 bytes each)
    else:
        m = arch.latent
        qk, v = m.nope + m.rope, m.v_dim
        down = h * (m.q_lora + m.kv_lora + m.rope)  # latent down-projections: the same on every TP rank
        up = (m.q_lora or h) * a * qk + m.kv_lora * a * (m.nope + m.v_dim) + a * m.v_dim * h
        out["params"] = up
        out["params_whole"] += down + m.q_lora + m.kv_lora  # and the latents' norms
        if arch.qkv_bias:  # DeepSeek's attention_bias: the down-projections' biases
            out["params_whole"] += m.q_lora + m.kv_lora + m.rope
        out["matmul"] = 2 * n * (down + up)
        out["model_flops"] = 2 * s * b * (down + up * t)
        # latents (and their norms' inputs), Q, K (nope and rope), V, output-projection input
        kept = ACT * n * (2 * (m.q_lora + m.kv_lora) + m.rope + a * qk + a * qk + a * m.v_dim + a * m.v_dim)
    # keys each query attends to: the sequence, or a sliding window of it
    keys = min(s, arch.window) if arch.window else s
    core = 2 * n * keys * a * (qk + v)  # Q K^T and scores x V (causal masking not discounted, as Megatron)
    out["core"] = core
    out["matmul"] += core
    out["model_flops"] += 2 * s * b * keys * arch.heads * (qk + v)
    scores = b * a * (s / c) * keys  # score elements a rank computes
    if arch.flash_attention:
        out["core_act"] = FP32 * n * a  # the softmax statistics
        out["core_stream"] = 0.0
    else:  # softmax output (and with dropout its mask and output) kept
        out["core_act"] = (5 if arch.dropout else 2) * scores
        out["core_stream"] = (13 if arch.dropout else 8) * scores
    full = ACT * s * b / c * h  # one [s/c, b, h] activation
    out["act"] = (ACT * held * h  # the norm's input
                  + (full / t if tr.sequence_parallel else full)  # the projections' input
                  + kept + out["core_act"] + (held * h if arch.dropout else 0.0))
    if arch.o_bias:  # the output projection's bias: whole on every TP rank (row-parallel)
        out["params_whole"] += h
    out["stream"] = (out["core_stream"] + held * h * (4 + (7 if arch.dropout else 6))  # norm, bias-dropout-add
                     + out.pop("extra_stream", 0.0))
    out["comm"] = _block_comm(full, tr, device, out["matmul"] - core)
    return out


def _block_comm(full: float, tr: Training, device: Device, gemm: float) -> tuple[float, float]:
    """Exposed TP collectives of one block (attention or MLP) whose linear layers run ``gemm``
    FLOPs forward: forward, backward seconds.  With sequence parallelism an all-gather in and a
    reduce-scatter out, and in the backward their transposes plus the all-gather again for the
    weight gradients; without, one all-reduce each way.  With ``tp_comm_overlap`` (Megatron's
    ``--tp-comm-overlap``: Transformer Engine splits each GEMM and its collective into chunks)
    only what exceeds the block's GEMMs is exposed: the forward's, twice that backward (data and
    weight gradients)."""
    if tr.tp == 1:
        return 0.0, 0.0
    link = links(device, tr, "tp")
    if tr.sequence_parallel:
        one = all_gather(full, tr.tp, link)
        forward, backward = 2 * one, 3 * one
    else:
        forward = backward = all_reduce(full, tr.tp, link)
    if tr.tp_comm_overlap:
        hide = device.matmul_seconds(gemm)
        forward, backward = max(forward - hide, 0.0), max(backward - 2 * hide, 0.0)
    return forward, backward


def dense_mlp(arch: Architecture, tr: Training, device: Device, ffn: int) -> dict:
    """A dense MLP block (its input norm included)."""
    s, b, h, t, c = tr.seq, tr.micro_batch, arch.hidden, tr.tp, tr.cp
    n = s * b / c
    held = n / t if tr.sequence_parallel else n
    f = ffn / t
    mats = 3 if arch.gated else 2
    full = ACT * n * h
    act = (ACT * held * h + (full / t if tr.sequence_parallel else full)  # norm input, fc1 input
           + ACT * n * f * (3 if arch.gated else 2)  # fc1 outputs (gate, up), activation output
           + (held * h if arch.dropout else 0.0))
    stream = held * h * (4 + (7 if arch.dropout else 6)) + ACT * n * f * (3 if arch.gated else 2)
    bias = (mats - 1) * f if arch.mlp_bias else 0.0  # column-parallel biases split over TP; fc2's whole
    return {"params": mats * h * f + bias, "params_whole": _norm_params(arch) + (h if arch.mlp_bias else 0.0),
            "matmul": 2 * n * mats * h * f,
            "act": act, "stream": stream, "comm": _block_comm(full, tr, device, 2 * n * mats * h * f),
            "model_flops": 2 * s * b * mats * h * ffn}


def moe_mlp(arch: Architecture, tr: Training, device: Device) -> dict:
    """A mixture-of-experts MLP block: router, routed experts (the tokens a rank's experts receive:
    ``s*b*top_k / (t*c)`` in expectation, whatever EP and ETP), shared experts like a dense MLP."""
    e = arch.experts
    s, b, h, t, c, u = tr.seq, tr.micro_batch, arch.hidden, tr.tp, tr.cp, tr.etp
    n = s * b / c
    held = n / t if tr.sequence_parallel else n
    routed = s * b * e.top_k / (t * c)  # token-assignments whose expert work this rank does
    out = dense_mlp(arch, tr, device, e.shared_ffn) if e.shared_ffn else {
        "params": 0.0, "params_whole": _norm_params(arch), "matmul": 0.0, "model_flops": 0.0,
        # the norm's input and its output, which the router keeps for its weight gradient (with
        # shared experts their fc1 keeps that same tensor, counted by the dense MLP)
        "act": 2 * ACT * held * h + (held * h if arch.dropout else 0.0),
        "stream": held * h * (4 + (7 if arch.dropout else 6)), "comm": (0.0, 0.0)}
    out["params_whole"] += h * e.experts + (h if e.shared_gate else 0)  # the router (and the shared experts' gate)
    out["expert_params"] = e.experts * 3 * h * e.ffn / (tr.ep * u)
    out["matmul"] += 2 * held * h * e.experts + routed * 6 * h * e.ffn
    out["model_flops"] += 2 * s * b * h * e.experts + s * b * e.top_k * 6 * h * e.ffn
    out["act_outputs"] = ACT * routed * e.ffn  # the activation function's output (fc2 input)
    out["act"] += (FP32 * held * e.experts  # router logits
                   + ACT * routed * (u * h + 3 * e.ffn))  # expert inputs, fc1 outputs, activation output
    out["act_stream"] = ACT * routed * 3 * e.ffn
    out["stream"] += out["act_stream"] + ACT * routed * u * h * 4  # permute and unpermute tokens
    a2a = ACT * routed * h  # what a rank sends to the other EP ranks (dispatch; combine the same)
    if tr.dispatcher == "flex":  # each token once per node holding one of its experts (ETP 1)
        if u > 1:
            raise ValueError(f"training.dispatcher: gpuknap costs the flex dispatcher (DeepEP, HybridEP) at "
                             f"expert-tensor-parallel size 1, not {u}; set expert_tensor_parallel to 1")
        fwd = 2 * flex_dispatch(a2a / e.top_k, e.top_k, e.experts, device, tr)
    else:
        fwd = 2 * all_to_all_across(a2a, device, tr, "ep")
    if u > 1:  # tokens gathered within the expert-tensor group, results reduce-scattered
        fwd += 2 * all_gather(a2a * u, u, links(device, tr, "etp"))
    out["ep"] = (fwd, fwd)
    return out


def layer_cost(arch: Architecture, tr: Training, device: Device, moe: bool) -> LayerCost:
    """The :class:`LayerCost` of a dense (``moe=False``) or MoE decoder layer."""
    att = attention(arch, tr, device)
    mlp = moe_mlp(arch, tr, device) if moe else dense_mlp(arch, tr, device, arch.ffn)
    s, b, t, c = tr.seq, tr.micro_batch, tr.tp, tr.cp
    full = ACT * s * b / c * arch.hidden
    cp_f = cp_b = 0.0
    if c > 1:  # ring exchange of each rank's K and V chunks, overlapped with the core's chunks
        kv_width = (2 * max(arch.kv / t, 1.0) * arch.d if arch.latent is None
                    else arch.heads / t * (arch.latent.nope + arch.latent.rope + arch.latent.v_dim))
        step = ACT * s / c * b * kv_width
        ring = (c - 1) * (step / links(device, tr, "cp").bandwidth + links(device, tr, "cp").latency)
        core_s = device.matmul_seconds(att["core"])
        cp_f = max(ring - core_s, 0.0)
        cp_b = max(2 * ring - 2 * core_s, 0.0)  # keys, values and their gradients
    ep = mlp.get("ep", (0.0, 0.0))
    return LayerCost(
        params=att["params"] + att["params_whole"] + mlp["params"] + mlp["params_whole"],
        expert_params=mlp.get("expert_params", 0.0),
        matmul=att["matmul"] + mlp["matmul"], core=att["core"],
        stream=att["stream"] + mlp["stream"], core_stream=att["core_stream"], act_stream=mlp.get("act_stream", 0.0),
        activations=att["act"] + mlp["act"], core_activations=att["core_act"],
        act_outputs=mlp.get("act_outputs", 0.0),
        layer_input=full / t if tr.sequence_parallel else full,
        tp_forward=att["comm"][0] + mlp["comm"][0], tp_backward=att["comm"][1] + mlp["comm"][1],
        cp_forward=cp_f, cp_backward=cp_b, ep_forward=ep[0], ep_backward=ep[1],
        model_flops=att["model_flops"] + mlp["model_flops"], moe=moe)
