"""How a model is trained, where its parallel groups sit, and what their messages cost.

:class:`Training` holds the sizes of a run: sequence length, micro-batch size,
tensor (TP), context (CP), expert (EP), expert-tensor (ETP), data (DP) and
pipeline (PP) parallel sizes, and the precision of weights, gradients and
optimizer state.  Ranks are laid out as Megatron-Core does by default
(``tp-cp-ep-dp-pp``: TP innermost, PP outermost; experts ``etp-ep-edp-pp``), so a
group whose ranks fit in one node talks over the node's links and any other
over the network (:meth:`Training.spans_nodes`).

Collectives are ring algorithms in the alpha-beta model (docs/costs.md,
"Communication"): on ``n`` ranks, an all-gather or reduce-scatter of a tensor of
``S`` bytes moves ``(n - 1) / n * S`` bytes per rank, an all-reduce twice that, an
all-to-all ``(n - 1) / n`` of what each rank holds, a point-to-point send its
bytes; each step also pays the link's latency.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ._devices import Device, plain_fields

#: Most ranks in one parallel dimension.
MAX_PARALLEL = 1 << 20
#: MoE token dispatchers costed (Megatron's ``--moe-token-dispatcher-type``; ``allgather`` is not).
DISPATCHERS = ("alltoall", "flex")


@dataclass(frozen=True)
class Training:
    """How a model is trained (see the module docstring).  ``expert_tensor_parallel`` None means
    Megatron's default: the TP size.  ``param_bytes``: weights plus gradients per parameter
    (bf16 weights, fp32 main gradients: 6); ``optimizer_bytes``: fp32 master weights and two
    Adam moments (12), divided over the data-parallel ranks with the distributed optimizer;
    ``tp_comm_overlap``: TP collectives overlapped with the GEMMs (Megatron's ``--tp-comm-overlap``);
    ``dispatcher``: how MoE layers send tokens to their experts, Megatron's ``alltoall`` (every routed
    copy of a token to its expert's rank) or ``flex`` (DeepEP, HybridEP: a token goes once to each
    rank holding one of its experts, crossing the network once per node, then NVLink; MoE layers
    need expert-tensor parallelism 1 with it)."""

    seq: int
    micro_batch: int = 1
    tensor_parallel: int = 1
    context_parallel: int = 1
    expert_parallel: int = 1
    expert_tensor_parallel: int | None = None
    data_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = True
    distributed_optimizer: bool = True
    param_bytes: float = 6.0
    optimizer_bytes: float = 12.0
    tp_comm_overlap: bool = False
    dispatcher: str = "alltoall"

    def __post_init__(self):
        plain_fields(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dispatcher":
                if value not in DISPATCHERS:
                    raise ValueError(f"training.dispatcher must be one of {', '.join(DISPATCHERS)}, got {value!r}")
            elif f.name in ("sequence_parallel", "distributed_optimizer", "tp_comm_overlap"):
                if not isinstance(value, bool):
                    raise ValueError(f"training.{f.name} must be true or false, got {value!r}")
            elif f.name.endswith("_bytes"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 64:
                    raise ValueError(f"training.{f.name} must be a number of bytes from 0 to 64, got {value!r}")
            elif value is not None:
                high = 10**7 if f.name in ("seq",) else MAX_PARALLEL
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                    raise ValueError(f"training.{f.name} must be an integer from 1 to {high:,}, got {value!r}")
        if self.seq % self.context_parallel:
            raise ValueError(f"training.seq: {self.seq} is not divisible by context_parallel={self.context_parallel}")
        if self.tp_comm_overlap and self.tensor_parallel > 1 and not self.sequence_parallel:
            raise ValueError("training.tp_comm_overlap: Megatron overlaps TP communication only with sequence "
                             "parallelism (sequence_parallel)")

    def sequence_rule(self) -> str | None:
        """What Megatron refuses about the sequence length for these sizes, or None: with CP > 1 it
        cuts each sequence into 2 x CP chunks (``arguments.py``); sequence parallelism splits a
        context-parallel rank's tokens over the TP ranks (``_split_along_first_dim``)."""
        cp, tp = self.context_parallel, self.tensor_parallel
        if cp > 1 and self.seq % (2 * cp):
            return (f"the sequence length {self.seq} (--seq) is not a multiple of 2 x the context-parallel size "
                    f"{cp} (--cp): Megatron cuts each sequence into 2 x CP chunks")
        if self.sequence_parallel and tp > 1 and (self.seq // cp) % tp:
            return (f"the {self.seq // cp} tokens of a context-parallel rank are not divisible by the tensor-parallel "
                    f"size {tp} (--tp), over which sequence parallelism splits them")
        return None

    @property
    def tp(self) -> int:
        return self.tensor_parallel

    @property
    def cp(self) -> int:
        return self.context_parallel

    @property
    def ep(self) -> int:
        return self.expert_parallel

    @property
    def etp(self) -> int:
        return self.tensor_parallel if self.expert_tensor_parallel is None else self.expert_tensor_parallel

    @property
    def dp(self) -> int:
        return self.data_parallel

    @property
    def pp(self) -> int:
        return self.pipeline_parallel

    @property
    def gpus(self) -> int:
        """Devices of the whole run: TP x CP x DP x PP."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def stage_ranks(self) -> int:
        """Devices of one pipeline stage (TP x CP x DP); EP x ETP must divide them."""
        return self.tp * self.cp * self.dp

    @property
    def expert_data_parallel(self) -> int:
        """Ranks of one stage holding the same expert shard (expert weights' data-parallel group)."""
        return max(self.stage_ranks // (self.ep * self.etp), 1)

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one data-parallel replica."""
        return self.seq * self.micro_batch

    def shards(self) -> float:
        """What the optimizer state of non-expert weights is divided by (DP x CP with the
        distributed optimizer: Megatron shards over the data-parallel group with CP folded in)."""
        return self.dp * self.cp if self.distributed_optimizer else 1

    def stride(self, group: str) -> tuple[int, int]:
        """``(stride, size)`` of a group's ranks in the rank order."""
        if group == "tp":
            return 1, self.tp
        if group == "cp":
            return self.tp, self.cp
        if group == "dp":
            return self.tp * self.cp, self.dp
        if group == "dpcp":  # the gradients' group: DP with CP folded in (Megatron's data-parallel-with-CP)
            return self.tp, self.cp * self.dp
        if group == "pp":
            return self.stage_ranks, self.pp
        if group == "etp":
            return 1, self.etp
        if group == "ep":
            return self.etp, self.ep
        if group == "edp":
            return self.etp * self.ep, self.expert_data_parallel
        raise ValueError(f"unknown group {group!r}")

    def spans_nodes(self, group: str, gpus_per_node: int) -> bool:
        """Whether any of the group's instances has ranks on more than one node."""
        return self.placement(group, gpus_per_node)[0]

    def placement(self, group: str, gpus_per_node: int) -> tuple[bool, int, bool]:
        """Where the group's instances sit on nodes of ``gpus_per_node`` GPUs (:func:`placement`)."""
        stride, size = self.stride(group)
        return placement(stride, size, gpus_per_node, self.gpus)


@lru_cache(maxsize=4096)
def placement(stride: int, size: int, per_node: int, world: int) -> tuple[bool, int, bool]:
    """Where the groups of ``size`` ranks ``stride`` apart sit on nodes of ``per_node`` consecutive
    ranks, the groups tiling ``world`` ranks in blocks of ``stride * size`` (Megatron's rank
    order): ``(spans, local, even)``.  ``spans``: some group has ranks on more than one node;
    ``local``: the fewest ranks such a group has on one of its nodes (``size`` when none spans),
    so its worst-placed rank has ``local - 1`` peers on its node and the node ``local`` ports for
    the group; ``even``: every such group has ``local`` ranks on each of its nodes.  A node size
    that does not align with a group's block leaves some groups straddling two nodes unevenly
    (TP 4 on nodes of 6: ranks 4-7 on two nodes, two on each)."""
    if size <= 1:
        return False, size, True
    if stride >= per_node:  # consecutive ranks of a group a node or more apart: one rank a node
        return True, 1, True
    span = stride * size
    starts = np.zeros(per_node, dtype=bool)  # where in a node a group can start: each block's lanes
    for k in range(min(max(1, world // span), per_node // math.gcd(span, per_node))):
        at = k * span % per_node
        starts[at:at + stride] = True
        starts[:max(0, at + stride - per_node)] = True
    at = np.flatnonzero(starts)
    first = np.minimum(size, (per_node - at + stride - 1) // stride)  # ranks on the group's first node
    crossing = first < size
    if not crossing.any():
        return False, size, True
    at, first = at[crossing], first[crossing]
    end = at + stride * (size - 1)  # the last rank, counted from the first node's start
    last = size - ((end // per_node) * per_node - at + stride - 1) // stride  # ranks on its last node
    low, high = _inner_counts(at, end // per_node, stride, per_node, size)
    local = int(min(first.min(), last.min(), low))
    even = bool((first == local).all() and (last == local).all() and low >= local and high <= local)
    return True, local, even


def _inner_counts(at: np.ndarray, nodes: np.ndarray, stride: int, per_node: int, size: int) -> tuple[int, int]:
    """The fewest and most ranks on a node wholly inside a group (``size``, 0 when no group has
    one), for groups starting ``at`` in their first node and ending in node ``nodes`` after it.
    Such a node holds ``q = per_node // stride`` ranks, or ``q + 1`` when the distance from its
    start to the group's next rank, ``(at - j * per_node) mod stride``, is under the remainder;
    that distance repeats within ``stride`` nodes."""
    keep = nodes >= 2
    if not keep.any():
        return size, 0
    q, rem = divmod(per_node, stride)
    if rem == 0:
        return q, q
    at, nodes = at[keep], nodes[keep]
    j = np.arange(1, min(int(nodes.max()), stride + 1))
    counts = q + ((at[:, None] - j[None, :] * per_node) % stride < rem)
    inside = j[None, :] < nodes[:, None]
    return int(counts[inside].min()), int(counts[inside].max())


@dataclass(frozen=True)
class Links:
    """The bandwidth and latency a group's messages see (already derated)."""

    bandwidth: float
    latency: float


#: Groups whose messages are NCCL collectives (rings): spanning nodes, their rings cross between
#: nodes once per channel, over as many of the node's network ports as the group has ranks there.
COLLECTIVE_GROUPS = frozenset({"tp", "etp", "dp", "dpcp", "edp"})


def links(device: Device, training: Training, group: str) -> Links:
    """What a group talks over: the node's links when its ranks fit in one node; otherwise the
    network, at one port's bandwidth per rank of the group on a node for collectives (NCCL runs a
    ring per port), capped by the node's links, and at one port's for the rest (all-to-all, sends:
    each rank's own traffic leaves through its own port)."""
    spans, local, _ = training.placement(group, device.gpus_per_node)
    if spans:
        ports = local if group in COLLECTIVE_GROUPS else 1
        bandwidth = min(ports * device.inter_bandwidth, max(device.intra_bandwidth, device.inter_bandwidth))
        return Links(bandwidth * device.link_efficiency, device.inter_latency)
    return Links(device.intra_bandwidth * device.link_efficiency, device.intra_latency)


def all_gather(nbytes: float, n: int, link: Links) -> float:
    """Seconds to all-gather (or reduce-scatter) a tensor of ``nbytes`` over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency


def all_reduce(nbytes: float, n: int, link: Links) -> float:
    """Seconds to all-reduce ``nbytes`` over ``n`` ranks (a reduce-scatter then an all-gather)."""
    return 2 * all_gather(nbytes, n, link)


def all_to_all(nbytes: float, n: int, link: Links) -> float:
    """Seconds for an all-to-all in which every rank holds ``nbytes`` and keeps ``1/n`` of them."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency


def all_to_all_across(nbytes: float, device: Device, training: Training, group: str) -> float:
    """Seconds for an all-to-all over ``group`` in which every rank holds ``nbytes`` and keeps
    ``1/n`` of them, each peer's share on the path to that peer: within one node the node's links;
    spanning nodes, the ``local - 1`` peers on the rank's own node over the node's links and the
    ``n - local`` others over the rank's own network port, both at once (the longer one counts)."""
    _, n = training.stride(group)
    if n <= 1:
        return 0.0
    spans, local, _ = training.placement(group, device.gpus_per_node)
    if not spans:
        return all_to_all(nbytes, n, links(device, training, group))
    eff = device.link_efficiency
    near = (local - 1) / n * nbytes / (device.intra_bandwidth * eff) + (local - 1) * device.intra_latency
    far = (n - local) / n * nbytes / (device.inter_bandwidth * eff) + (n - local) * device.inter_latency
    return max(near, far)


def nodes_reached(experts: int, top_k: int, ranks: int, local: int) -> float:
    """Expected number of the other nodes of an EP group of ``ranks`` ranks, ``local`` on each node
    (the last node the rest), that hold at least one of a token's ``top_k`` experts: the
    ``experts`` spread evenly over the ranks and chosen uniformly without repetition (the even
    routing the cost model assumes), seen from a rank on the first node."""
    sizes = [min(local, ranks - start) for start in range(local, ranks, local)]  # the other nodes' ranks
    total = 0.0
    for size in sizes:
        held = experts * size // ranks
        missed = 1.0  # C(experts - held, top_k) / C(experts, top_k): the node holds none of them
        for i in range(min(top_k, experts)):
            missed *= max(experts - held - i, 0) / (experts - i)
        total += 1.0 - missed
    return total


def flex_dispatch(token_bytes: float, top_k: int, experts: int, device: Device, training: Training) -> float:
    """Seconds for one dispatch (or combine) of the flex dispatcher (DeepEP, HybridEP) in which a
    rank holds tokens of ``token_bytes`` in all, each routed to ``top_k`` of ``experts``: a token
    goes once to each rank holding one of its experts, however many of them it holds.  Within one
    node, to each other rank it reaches (:func:`nodes_reached` with one rank a node) over the
    node's links; spanning nodes, over the rank's port once per other node holding one of its
    experts (:func:`nodes_reached`), and over NVLink to the other ranks it reaches on its own node
    and, forwarded on arrival, on each node reached: both at once (the longer one counts).  Its
    kernels write to every peer at once, so each path pays one latency, not one per peer."""
    _, n = training.stride("ep")
    if n <= 1:
        return 0.0
    ranks = nodes_reached(experts, top_k, n, 1)  # the other ranks a token reaches
    spans, local, even = training.placement("ep", device.gpus_per_node)
    if not spans:
        link = links(device, training, "ep")
        return token_bytes * ranks / link.bandwidth + link.latency
    if not even:
        raise ValueError(f"training.dispatcher: the flex dispatcher is costed for EP groups with as many ranks on "
                         f"each of their nodes, and EP {n} (ranks {training.stride('ep')[0]} apart) sits unevenly on "
                         f"nodes of {device.gpus_per_node} GPUs; use an EP size that is a multiple of the GPUs per "
                         "node (or fits in one node), or the alltoall dispatcher")
    eff = device.link_efficiency
    reached = nodes_reached(experts, top_k, n, local)
    # each of the n / local nodes' other local - 1 ranks is reached with the same chance, ranks / (n - 1):
    # the own node's directly, the others' forwarded by the rank that received the token there
    forwarded = token_bytes * ranks / (n - 1) * (local - 1) * (n // local)
    near = forwarded / (device.intra_bandwidth * eff) + device.intra_latency * (local > 1)
    far = token_bytes * reached / (device.inter_bandwidth * eff) + device.inter_latency
    return max(near, far)


def send(nbytes: float, link: Links) -> float:
    """Seconds for one point-to-point message of ``nbytes``."""
    return nbytes / link.bandwidth + link.latency
