"""The flex token dispatcher (DeepEP, HybridEP; ``--dispatcher flex``): a token crosses the network
once per other node holding one of its experts, then NVLink.  Checked against independent
computations: the nodes a token reaches by enumerating every choice of its experts, the
dispatch written out peer by peer, and the whole model's EP time against the alltoall one.  Within a node a token goes once to each
rank holding one of its experts (DeepEP's ``is_token_in_rank``), not once per routed copy."""
from __future__ import annotations

import itertools
import json
import math
import os

import pytest

from gpuknap import formats
from gpuknap.cli import main
from gpuknap.costs import Training, device, flex_dispatch, nodes_reached
from gpuknap.costs._comm import all_to_all_across

EXAMPLES = os.path.join(os.path.dirname(formats.__file__), "..", "examples")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")
QWEN3 = os.path.join(EXAMPLES, "qwen3_235b_a22b_2507_config.json")


def _reached_by_enumeration(experts: int, top_k: int, ranks: int, local: int) -> float:
    """Every choice of ``top_k`` experts, equally likely: the mean number of other nodes hit (rank r
    holds experts ``r*E/n .. (r+1)*E/n - 1``; node j holds ranks ``j*local ..``; seen from node 0)."""
    per_rank = experts // ranks
    node_of = [(e // per_rank) // local for e in range(experts)]
    total = count = 0
    for chosen in itertools.combinations(range(experts), top_k):
        total += len({node_of[e] for e in chosen} - {0})
        count += 1
    return total / count


@pytest.mark.parametrize("experts, top_k, ranks, local", [
    (8, 2, 4, 2), (8, 1, 8, 4), (12, 3, 6, 4), (16, 4, 8, 2), (16, 2, 16, 4), (16, 8, 8, 8), (12, 12, 6, 2),
    (18, 3, 6, 4),  # 6 ranks on nodes of 4: the last node holds 2 ranks' experts
])
def test_nodes_reached_matches_every_choice_of_experts(experts, top_k, ranks, local):
    assert nodes_reached(experts, top_k, ranks, local) == pytest.approx(
        _reached_by_enumeration(experts, top_k, ranks, local), rel=1e-12)


def test_nodes_reached_matches_the_hypergeometric_count_at_scale():
    for experts, top_k, ranks, local in ((128, 8, 32, 8), (256, 8, 64, 8), (160, 6, 40, 8), (64, 6, 16, 4)):
        nodes = ranks // local
        held = experts // nodes
        expected = (nodes - 1) * (1 - math.comb(experts - held, top_k) / math.comb(experts, top_k))
        assert nodes_reached(experts, top_k, ranks, local) == pytest.approx(expected, rel=1e-12)


def _hit_by_enumeration(experts: int, top_k: int, ranks: int, local: int) -> tuple[float, float]:
    """Every choice of ``top_k`` experts, equally likely (rank r holds experts ``r*E/n ..``): the
    mean number of the other ranks of node 0 holding one of them (``local`` ranks a node), and of
    the other ranks of the group."""
    per_rank = experts // ranks
    own = every = count = 0
    for chosen in itertools.combinations(range(experts), top_k):
        hit = {e // per_rank for e in chosen} - {0}
        own += sum(r < local for r in hit)
        every += len(hit)
        count += 1
    return own / count, every / count


def _flex_by_hand(token_bytes, top_k, experts, dev, tr):
    """The flex dispatch of rank 0, peer by peer.  Within a node: each token to every other rank
    holding one of its experts, once.  Spanning nodes: over its port each token once per other
    node reached; over NVLink each of its tokens once to every other rank of its node it reaches,
    and each token arriving from the rank of its local index on another node once to every other
    rank of its node that token reaches (the routing of every sender alike)."""
    stride, n = tr.stride("ep")
    local = min(n, dev.gpus_per_node // stride)
    own, every = _hit_by_enumeration(experts, top_k, n, local)
    if n <= local:
        return token_bytes * every / (dev.intra_bandwidth * dev.link_efficiency) + dev.intra_latency  # one kernel
    eff, nodes = dev.link_efficiency, n // local
    direct = token_bytes * own
    forwarded = (nodes - 1) * token_bytes * own  # from each other node's sender of rank 0's local index
    near = (direct + forwarded) / (dev.intra_bandwidth * eff) + dev.intra_latency
    far = token_bytes * _reached_by_enumeration(experts, top_k, n, local) / (dev.inter_bandwidth * eff) + dev.inter_latency
    return max(near, far)


def test_flex_dispatch_spanning_nodes_matches_the_hand_count_and_beats_alltoall():
    dev = device("h100", gpus_per_node=4)
    for experts, top_k, ep in ((16, 4, 8), (16, 2, 16), (12, 3, 12), (24, 6, 8)):
        tr = Training(seq=4096, tensor_parallel=2, expert_parallel=ep, expert_tensor_parallel=1, data_parallel=ep,
                      dispatcher="flex")
        got = flex_dispatch(1e8, top_k, experts, dev, tr)
        assert got == pytest.approx(_flex_by_hand(1e8, top_k, experts, dev, tr), rel=1e-12)
        assert got < all_to_all_across(1e8 * top_k, dev, tr, "ep")


def test_flex_dispatch_within_a_node_sends_a_token_once_to_each_rank_it_reaches():
    """A rank holding two of a token's experts gets it once (DeepEP's ``is_token_in_rank``), where
    the alltoall dispatcher sends every routed copy; with one expert a token the two agree."""
    dev = device("h100")
    for experts, top_k, ep in ((16, 2, 8), (16, 4, 4), (24, 3, 8), (8, 8, 8)):
        tr = Training(seq=4096, tensor_parallel=1, expert_parallel=ep, expert_tensor_parallel=1, data_parallel=8,
                      dispatcher="flex")
        got = flex_dispatch(3e7, top_k, experts, dev, tr)
        assert got == pytest.approx(_flex_by_hand(3e7, top_k, experts, dev, tr), rel=1e-12)
        a2a = all_to_all_across(3e7 * top_k, dev, tr, "ep") - (ep - 1) * dev.intra_latency  # its bytes alone
        assert got - dev.intra_latency < a2a if experts // ep > 1 else got - dev.intra_latency == pytest.approx(a2a)
        single = flex_dispatch(3e7, 1, experts, dev, tr) - dev.intra_latency  # one expert a token: the same bytes
        assert single == pytest.approx(all_to_all_across(3e7, dev, tr, "ep") - (ep - 1) * dev.intra_latency, rel=1e-12)
    one = Training(seq=4096, expert_parallel=1, expert_tensor_parallel=1, dispatcher="flex")
    assert flex_dispatch(3e7, 2, 64, dev, one) == 0.0


def _run(capsys, *argv):
    rc = main(["timeline", *argv, "--json", "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_the_model_costs_flex_once_per_node_and_alltoall_otherwise(capsys):
    """Qwen3-235B-A22B as the Megatron-MoE model zoo ran it (TP 2, EP 32 at ETP 1 over four nodes):
    the EP time with flex is the alltoall one scaled by the bytes that cross a port, the rest of
    the run unchanged; within one node (EP 8) the EP time scaled by the ranks a token reaches
    against the copies alltoall sends."""
    common = [QWEN3, "--stages", "8", "--interleave", "4", "--etp", "1", "--seq", "4096", "--micro-batch-size", "1",
              "--device", "h100", "--counts", ",".join(["3"] * 32)]
    wide = ["--tp", "2", "--ep", "32", "--dp", "16", "--micro-batches", "128"]
    a2a, flex = (_run(capsys, *common, *wide, "--dispatcher", d) for d in ("alltoall", "flex"))
    ep = {name: [stage["ep"] for stage in run["stage_breakdown"]] for name, run in (("alltoall", a2a), ("flex", flex))}
    # a rank's 4096 / TP 2 tokens of 4096 bf16 values, each routed to 8 of 128 experts; each stage's
    # EP time is its MoE layers' dispatches and combines
    dev, tokens = device("h100"), 2 * 2048 * 4096
    tr = Training(seq=4096, tensor_parallel=2, expert_parallel=32, expert_tensor_parallel=1, data_parallel=16)
    ratio = flex_dispatch(tokens, 8, 128, dev, tr) / all_to_all_across(8 * tokens, dev, tr, "ep")
    assert 0.35 < ratio < 0.45  # about 2.7 nodes a token against 6 copies to other nodes, and fewer latencies
    assert ep["flex"] == pytest.approx([t * ratio for t in ep["alltoall"]], rel=1e-9), ep
    assert [stage["compute"] for stage in a2a["stage_breakdown"]] == [stage["compute"] for stage in flex["stage_breakdown"]]
    assert flex["iteration_time_s"] < a2a["iteration_time_s"]
    narrow = ["--tp", "4", "--ep", "8", "--dp", "8", "--micro-batches", "256"]
    a2a, flex = (_run(capsys, *common, *narrow, "--dispatcher", d) for d in ("alltoall", "flex"))
    tr = Training(seq=4096, tensor_parallel=4, expert_parallel=8, expert_tensor_parallel=1, data_parallel=8)
    tokens = 2 * 1024 * 4096
    ratio = flex_dispatch(tokens, 8, 128, dev, tr) / all_to_all_across(8 * tokens, dev, tr, "ep")
    assert 0.5 < ratio < 0.7  # within a node: 4.6 of the 7 other ranks a token against its 7 copies, one latency
    assert [stage["ep"] for stage in flex["stage_breakdown"]] == pytest.approx(
        [stage["ep"] * ratio for stage in a2a["stage_breakdown"]], rel=1e-9)


def test_flex_needs_expert_tensor_parallel_one_and_says_so_on_dense_models(capsys):
    rc = main(["best", MIXTRAL, "--stages", "2", "--tp", "2", "--ep", "2", "--dp", "2", "--seq", "4096",
               "--micro-batches", "8", "--dispatcher", "flex", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "flex dispatcher" in err[0] and "it is 2 (the TP size); give --etp 1" in err[0]
    with pytest.raises(ValueError, match="training.dispatcher must be one of alltoall, flex"):
        Training(seq=4096, dispatcher="deepep")
    rc = main(["best", os.path.join(EXAMPLES, "llama2_7b_config.json"), "--stages", "2", "--seq", "4096",
               "--micro-batches", "8", "--dp", "1", "--dispatcher", "flex", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and "flex dispatcher: the model has no MoE layers" in err, err


def test_emitted_settings_say_flex_and_read_back_the_same(capsys, tmp_path):
    """``--emit megatron`` writes the flex dispatcher (DeepEP's backend); ``rank --from`` reads it back
    to the same run; MindFormers' settings cannot state it and are refused by name."""
    plan = [QWEN3, "--stages", "8", "--tp", "2", "--ep", "32", "--etp", "1", "--dp", "16", "--seq", "4096",
            "--micro-batches", "128", "--device", "h100", "--dispatcher", "flex", "--quiet"]
    assert main(["best", *plan, "--emit", "megatron"]) == 0
    text = capsys.readouterr().out
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    start = text.index("GPUKNAP_ARGS=(")
    path = tmp_path / "args.sh"
    path.write_text(text[start:text.index(")\n", start) + 2])
    assert main(["rank", QWEN3, "--from", str(path), "--seq", "4096", "--dp", "16", "--device", "h100", "--json",
                 "--quiet"]) == 0
    read = json.loads(capsys.readouterr().out)["best"]
    assert main(["rank", QWEN3, "--from", str(path), "--seq", "4096", "--dp", "16", "--device", "h100", "--json",
                 "--dispatcher", "flex", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == read
    assert main(["best", *plan, "--emit", "mindformers"]) == 2
    assert "MindFormers' settings do not state" in capsys.readouterr().err


def test_a_sweep_costs_every_configuration_with_flex_and_its_rows_reproduce(capsys):
    """``sweep --dispatcher flex``: configurations with ETP > 1 are skipped with the reason; each row's
    command (which carries ``--dispatcher flex``) gives that row's time; EP 8 over two nodes of 4
    runs faster than with alltoall."""
    grid = [MIXTRAL, "--gpus", "16", "--global-batch", "64", "--seq", "4096", "--stages", "2", "--tp", "2",
            "--ep", "2,8", "--etp", "1,2", "--gpus-per-node", "4", "--all", "--json", "--quiet"]
    got = {}
    for name in ("alltoall", "flex"):
        assert main(["sweep", *grid, "--dispatcher", name]) == 0
        got[name] = json.loads(capsys.readouterr().out)
    flex = got["flex"]
    assert any("flex dispatcher" in s["reason"] and "give --etp 1" in s["reason"] for s in flex["skipped"])
    (row,) = [r for r in flex["rows"] if r["config"]["expert_parallel"] == 8]
    assert "--dispatcher" in row["command"] and row["command"][row["command"].index("--dispatcher") + 1] == "flex"
    assert main([*row["command"][1:], "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["iteration_time_s"] == row["iteration_time_s"]
    (plain,) = [r for r in got["alltoall"]["rows"] if r["config"]["expert_parallel"] == 8]
    assert row["iteration_time_s"] < plain["iteration_time_s"]


def test_flex_where_gpuknap_does_not_cost_it(capsys, tmp_path):
    """A review's findings: a Megatron launch running flex at ETP > 1 (which Megatron allows) is
    costed as alltoall with a note, not refused with advice the file cannot follow; flex is not
    written for EP x ETP = 1, which Megatron's flex dispatcher refuses; an EP group spread over
    nodes unevenly is refused by name (the hierarchical count assumes as many ranks on each node)."""
    plan = [QWEN3, "--stages", "8", "--tp", "2", "--ep", "32", "--etp", "1", "--dp", "16", "--seq", "4096",
            "--micro-batches", "128", "--device", "h100", "--dispatcher", "flex", "--quiet"]
    assert main(["best", *plan, "--emit", "megatron"]) == 0
    text = capsys.readouterr().out
    start = text.index("GPUKNAP_ARGS=(")
    args = text[start:text.index(")\n", start) + 2]
    wide = tmp_path / "etp2.sh"
    wide.write_text(args.replace("--expert-tensor-parallel-size 1", "--expert-tensor-parallel-size 2")
                    .replace("--expert-model-parallel-size 32", "--expert-model-parallel-size 16"))
    plain = tmp_path / "a2a.sh"
    plain.write_text(wide.read_text().replace("type flex", "type alltoall"))
    runs = []
    for path in (wide, plain):
        assert main(["rank", QWEN3, "--from", str(path), "--seq", "4096", "--dp", "16", "--device", "h100", "--json",
                     "--quiet"]) in (0, 1)
        out = capsys.readouterr()
        runs.append((json.loads(out.out)["best"], out.err))
    assert runs[0][0] == runs[1][0] and "costed as the alltoall dispatcher" in runs[0][1]
    small = os.path.join(EXAMPLES, "mixtral_small_config.json")
    assert main(["best", small, "--stages", "2", "--tp", "2", "--ep", "1", "--etp", "1", "--dp", "2", "--seq", "4096",
                 "--micro-batches", "8", "--dispatcher", "flex", "--emit", "megatron", "--quiet"]) == 0
    assert "--moe-token-dispatcher-type alltoall" in capsys.readouterr().out
    tr = Training(seq=4096, tensor_parallel=1, expert_parallel=12, expert_tensor_parallel=1, data_parallel=12,
                  dispatcher="flex")
    with pytest.raises(ValueError, match=r"EP 12 \(ranks 1 apart\) sits unevenly on nodes of 8 GPUs"):
        flex_dispatch(1e6, 2, 24, device("h100"), tr)
