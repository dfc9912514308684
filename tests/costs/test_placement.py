"""Where parallel groups sit on nodes (``costs.placement``): checked against placing every rank
of every group, for node sizes that align with the groups and sizes that do not (nodes of 6, 12,
72 GPUs leave some groups straddling two nodes), and what that does to the costs."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from gpuknap.costs import Training, device, flex_dispatch
from gpuknap.costs._comm import all_to_all_across, links, placement


def _placed(stride: int, size: int, per_node: int, world: int) -> tuple[bool, int, bool]:
    """Every group of the rank order (blocks of stride x size, lanes within a block), every rank's
    node counted."""
    if size <= 1:
        return False, size, True
    per_group = []
    span = stride * size
    for block in range(world // span):
        for lane in range(stride):
            nodes = Counter((block * span + lane + i * stride) // per_node for i in range(size))
            if len(nodes) > 1:
                per_group.append(sorted(nodes.values()))
    if not per_group:
        return False, size, True
    local = min(c[0] for c in per_group)
    return True, local, all(c[0] == c[-1] == local for c in per_group)


def test_placement_matches_placing_every_rank():
    rng = random.Random(13)
    cases = [(1, 4, 6, 24), (1, 8, 12, 48), (4, 3, 6, 24), (1, 64, 72, 576), (8, 9, 72, 144), (3, 5, 7, 105),
             (2, 16, 8, 64), (8, 4, 8, 64), (16, 2, 8, 64), (5, 3, 4, 30), (1, 2, 3, 6), (6, 4, 6, 48)]
    for _ in range(600):
        stride, size, per_node = rng.randint(1, 12), rng.randint(1, 20), rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24])
        cases.append((stride, size, per_node, stride * size * rng.randint(1, 6)))
    for case in cases:
        assert placement(*case) == _placed(*case), case


def test_aligned_node_sizes_cost_as_before():
    """Nodes that groups tile (powers of two here): a group spans nodes exactly when its block is
    wider than a node, with min(size, per_node // stride) ranks on each."""
    for stride in (1, 2, 4, 8, 16):
        for size in (1, 2, 4, 8, 16, 32):
            for per_node in (1, 2, 4, 8, 16):
                spans, local, even = placement(stride, size, per_node, stride * size * 4)
                assert spans == (size > 1 and stride * size > per_node)
                assert even and local == (max(1, min(size, per_node // stride)) if spans else size)


def test_groups_straddling_two_nodes_are_costed_on_the_network():
    """A red team's finding: TP 4 on nodes of 6 puts ranks 4-7 on two nodes, two on each, and was
    costed on the node's links; EP 8 on nodes of 12 splits the second group 4 + 4."""
    tr = Training(seq=4096, tensor_parallel=4, data_parallel=3)
    six, eight = device("h100", gpus_per_node=6), device("h100", gpus_per_node=8)
    assert links(eight, tr, "tp").bandwidth == eight.intra_bandwidth * eight.link_efficiency
    two_ports = min(2 * six.inter_bandwidth, six.intra_bandwidth) * six.link_efficiency
    assert links(six, tr, "tp").bandwidth == two_ports  # as TP 4 over two nodes of two
    ep = Training(seq=4096, tensor_parallel=1, expert_parallel=8, expert_tensor_parallel=1, data_parallel=24)
    twelve, four = device("h100", gpus_per_node=12), device("h100", gpus_per_node=4)
    assert all_to_all_across(1e8, twelve, ep, "ep") == all_to_all_across(1e8, four, ep, "ep")
    flex = Training(seq=4096, tensor_parallel=1, expert_parallel=8, expert_tensor_parallel=1, data_parallel=24,
                    dispatcher="flex")
    assert flex_dispatch(1e8, 2, 16, twelve, flex) == flex_dispatch(1e8, 2, 16, four, flex)  # 4 + 4 either way
    with pytest.raises(ValueError, match=r"EP 8 \(ranks 1 apart\) sits unevenly on nodes of 6 GPUs"):
        flex_dispatch(1e8, 2, 16, six, flex)  # ranks 0-5 and 6-7


def test_gradients_reduce_over_dp_x_cp_where_those_ranks_sit():
    """A red team's finding: with DP 1 and CP 2 the gradients' group is the two CP ranks, on two
    nodes at TP 8, and was costed on NVLink (its DP group of one rank fits anywhere); it is the
    group of TP-stride ranks DP x CP long, as Megatron's data-parallel group with CP."""
    h100 = device("h100")
    cp = Training(seq=4096, tensor_parallel=8, context_parallel=2, data_parallel=1)
    dp = Training(seq=4096, tensor_parallel=8, context_parallel=1, data_parallel=2)
    assert cp.placement("dpcp", 8) == dp.placement("dpcp", 8) == (True, 1, True)
    assert links(h100, cp, "dpcp") == links(h100, dp, "dpcp") == links(h100, dp, "dp")
    wide = Training(seq=4096, tensor_parallel=1, context_parallel=2, data_parallel=8)
    assert links(h100, wide, "dpcp").bandwidth == links(
        h100, Training(seq=4096, tensor_parallel=1, data_parallel=16), "dp").bandwidth  # 8 ports, not 4
    from gpuknap.costs._build import ModelCosts
    tails = [ModelCosts(device=h100, training=tr, micro_batches=1, params={"dense": 8.4e8}).tail({"dense": 1}, 10.0, 20.0)
             for tr in (cp, dp)]
    assert tails[0] == tails[1] > 25.0  # ms: the same two ranks on two nodes reduce 1.7 GB of fp32 gradients


def test_dense_and_expert_buckets_each_leave_their_last_one_exposed():
    """A red team's finding: doubling DP (expert data parallelism 1 -> 2) lowered the exposed
    gradient traffic, the expert buckets' smaller mean pulling down the pooled last bucket; dense
    and expert gradients fill buffers of their own, so the larger last bucket stays exposed."""
    from gpuknap.costs._build import BUCKET_PARAMS, FP32, ACT, ModelCosts, _adam_seconds
    from gpuknap.costs._comm import all_gather

    h100 = device("a100-40gb", gpus_per_node=16)
    dense, expert = 47.5 * BUCKET_PARAMS, 300.0 * BUCKET_PARAMS
    exposed = []
    for dp in (4, 8):
        tr = Training(seq=4096, tensor_parallel=1, expert_parallel=4, expert_tensor_parallel=1, data_parallel=dp)
        costs = ModelCosts(device=h100, training=tr, micro_batches=2, params={"moe": dense},
                           expert_params={"moe": expert})
        tail = costs.tail({"moe": 1}, 1e9, 1e9) / 1e3 - _adam_seconds(dense, expert, tr, h100)  # all hidden but the last
        k = -(-dense // BUCKET_PARAMS)
        last = sum(all_gather(b * dense / k, dp, links(h100, tr, "dpcp")) for b in (FP32, ACT))
        assert tail == pytest.approx(max(last, tail)) and tail >= last * (1 - 1e-12)
        exposed.append(tail)
    assert exposed[1] >= exposed[0]
