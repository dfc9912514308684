"""Communication that hides behind computation, and only as far as there is computation:
data-parallel buckets behind one micro-batch's backward and forward, TP collectives behind their
block's GEMMs with ``tp_comm_overlap``, and the network ports a collective crosses through.  Each
is checked against an independent computation (an event-by-event bucket schedule, the ring
formula and FLOP counts written out here), not stored numbers."""
from __future__ import annotations

import json
import random

import pytest

from gpuknap.cli import main
from gpuknap.costs import device, gpt, transformer_model
from gpuknap.costs._build import exposed
from gpuknap.costs._comm import Training, all_to_all, all_to_all_across, links

GIB = 2**30


def _bucket_schedule(comm: float, buckets: int, window: float) -> float:
    """What sending ``buckets`` equal buckets one after another leaves after a computation of
    ``window`` seconds that readies bucket ``i`` at ``window * (i + 1) / buckets``: event by event."""
    free = 0.0
    for i in range(buckets):
        ready = window * (i + 1) / buckets
        free = max(free, ready) + comm / buckets
    return free - window


def test_exposed_matches_an_event_by_event_bucket_schedule():
    rng = random.Random(7)
    for _ in range(2000):
        comm, window, k = rng.uniform(0, 5), rng.choice([0.0, rng.uniform(0, 5)]), rng.randint(1, 200)
        assert exposed(comm, k, window) == pytest.approx(_bucket_schedule(comm, k, window), abs=1e-12)
    assert exposed(0.0, 5, 1.0) == 0.0


def test_collectives_cross_between_nodes_through_one_port_per_rank_on_a_node():
    dev = device("h100")  # 8 GPUs a node, 50 GB/s a port, 450 GB/s NVLink, 80 % of each
    port, nvlink = dev.inter_bandwidth * dev.link_efficiency, dev.intra_bandwidth * dev.link_efficiency
    assert links(dev, Training(seq=4096, tensor_parallel=1, data_parallel=48), "dp").bandwidth == pytest.approx(
        min(8 * dev.inter_bandwidth, dev.intra_bandwidth) * dev.link_efficiency)
    assert links(dev, Training(seq=4096, tensor_parallel=2, data_parallel=48), "dp").bandwidth == pytest.approx(4 * port)
    assert links(dev, Training(seq=4096, tensor_parallel=8, data_parallel=48), "dp").bandwidth == pytest.approx(port)
    assert links(dev, Training(seq=4096, tensor_parallel=16), "tp").bandwidth == pytest.approx(
        min(8 * dev.inter_bandwidth, dev.intra_bandwidth) * dev.link_efficiency)
    # an all-to-all and the pipeline's sends: each rank's own port
    assert links(dev, Training(seq=4096, tensor_parallel=1, expert_parallel=16, data_parallel=16),
                 "ep").bandwidth == pytest.approx(port)
    assert links(dev, Training(seq=4096, tensor_parallel=8, data_parallel=1, pipeline_parallel=2),
                 "pp").bandwidth == pytest.approx(port)
    assert links(dev, Training(seq=4096, tensor_parallel=8), "tp").bandwidth == pytest.approx(nvlink)


def _peer_by_peer(nbytes, dev, tr, group):
    """An all-to-all written out per peer: the ranks of the group holding global rank 0 (stride and
    size from Megatron's order), each peer's ``nbytes/n`` over NVLink when it sits on rank 0's node,
    else over rank 0's own port; the two paths run at once."""
    stride, n = tr.stride(group)
    node = [stride * j // dev.gpus_per_node for j in range(n)]
    near = sum(1 for j in range(1, n) if node[j] == node[0])
    far = n - 1 - near
    eff = dev.link_efficiency
    if far == 0:
        return near * (nbytes / n / (dev.intra_bandwidth * eff) + dev.intra_latency)
    return max(near * (nbytes / n / (dev.intra_bandwidth * eff) + dev.intra_latency),
               far * (nbytes / n / (dev.inter_bandwidth * eff) + dev.inter_latency))


def test_an_all_to_all_spanning_nodes_sends_to_its_node_over_nvlink_and_the_rest_over_its_port():
    """EP 32 at ETP 1 has 8 of its ranks on each node: 7/32 of a rank's bytes stay on NVLink
    and 24/32 cross its port, at once (the red team's Qwen3-235B case sent 31/32 through the
    port). Every EP, ETP and gpus-per-node combination against the peer-by-peer count."""
    rng = random.Random(3)
    for _ in range(300):
        etp, ep = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8, 16, 32, 64])
        dev = device("h100", gpus_per_node=rng.choice([4, 8, 16]))
        tr = Training(seq=4096, tensor_parallel=etp, expert_parallel=ep, expert_tensor_parallel=etp, data_parallel=ep)
        nbytes = rng.uniform(1e6, 1e9)
        assert all_to_all_across(nbytes, dev, tr, "ep") == pytest.approx(_peer_by_peer(nbytes, dev, tr, "ep"),
                                                                         rel=1e-12)
    dev = device("h100")
    inside = Training(seq=4096, expert_parallel=8, data_parallel=8)
    assert all_to_all_across(1e8, dev, inside, "ep") == all_to_all(1e8, 8, links(dev, inside, "ep"))
    across = Training(seq=4096, tensor_parallel=8, expert_parallel=4, expert_tensor_parallel=8, data_parallel=4)
    assert all_to_all_across(1e8, dev, across, "ep") == pytest.approx(all_to_all(1e8, 4, links(dev, across, "ep")))


@pytest.mark.parametrize("hidden, seq", [(1024, 512), (8192, 4096)])  # collectives above, then below, the GEMMs
def test_tp_overlap_exposes_what_exceeds_the_blocks_gemms(hidden, seq):
    t, heads = 8, 16
    dev = device("h100")
    kwargs = dict(layers=2, hidden=hidden, heads=heads, seq=seq, vocab=0, tensor_parallel=t, micro_batch=1,
                  dropout=False, device="h100")
    plain = transformer_model(gpt(**kwargs), 80 * GIB, 4).fronts["dense"][0]
    hidden_tp = transformer_model(gpt(**kwargs, tp_comm_overlap=True), 80 * GIB, 4).fronts["dense"][0]
    # written out: sequence parallelism, two all-gathers' worth per block forward, three backward
    link = links(dev, Training(seq=seq, tensor_parallel=t), "tp")
    one = (t - 1) / t * 2 * seq * hidden / link.bandwidth + (t - 1) * link.latency
    gemm = {"attention": 2 * seq * 4 * hidden * hidden / t, "mlp": 2 * seq * 2 * hidden * 4 * hidden / t}
    expected = 0.0
    for flops in gemm.values():
        secs = flops / (dev.peak_flops * dev.efficiency)
        expected += max(2 * one - secs, 0.0) + max(3 * one - 2 * secs, 0.0)
    assert dict(plain.parts)["tp"] == pytest.approx(2 * 5 * one * 1e3)
    assert dict(hidden_tp.parts).get("tp", 0.0) == pytest.approx(expected * 1e3)
    assert (expected > 0.5 * 10 * one) == (hidden == 1024)  # small GEMMs hide little; large ones nearly all
    saved = (plain.forward_time + plain.backward_time) - (hidden_tp.forward_time + hidden_tp.backward_time)
    assert saved == pytest.approx((10 * one - expected) * 1e3)


def test_tp_overlap_needs_sequence_parallelism():
    with pytest.raises(ValueError, match="tp_comm_overlap.*sequence"):
        Training(seq=4096, tensor_parallel=2, sequence_parallel=False, tp_comm_overlap=True)
    Training(seq=4096, tensor_parallel=1, sequence_parallel=False, tp_comm_overlap=True)  # nothing to overlap
    with pytest.raises(ValueError, match="tp_comm_overlap"):
        Training(seq=4096, tp_comm_overlap=1)


CONFIG = "gpuknap/examples/llama2_7b_config.json"
RUN = ["--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096", "--tp", "4", "--dp", "8", "--quiet"]
LLAMA = [CONFIG, "--stages", "4", *RUN]


def _times(capsys, argv: list) -> list:
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    entry = payload["best"] if "best" in payload else payload["results"][0]
    return [s["time"] for s in entry["stages"]]


def test_megatron_settings_state_the_overlaps_the_plan_assumed_and_read_back_the_same(capsys, tmp_path):
    assert main(["best", *LLAMA, "--tp-comm-overlap", "--emit", "megatron"]) == 0
    text = capsys.readouterr().out
    for flag in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather", "--sequence-parallel"):
        assert f"    {flag}\n" in text, flag
    script = tmp_path / "run.sh"
    script.write_text(text)
    planned = _times(capsys, ["best", *LLAMA, "--tp-comm-overlap"])
    read = _times(capsys, ["rank", CONFIG, "--from", str(script), *RUN])
    assert read == planned
    without = text.replace("    --tp-comm-overlap\n", "")
    script.write_text(without)
    exposed_tp = _times(capsys, ["rank", CONFIG, "--from", str(script), *RUN])
    assert all(a > b for a, b in zip(exposed_tp, read))  # the same plan with TP communication exposed
    assert main(["rank", CONFIG, "--from", str(script), *RUN, "--tp-comm-overlap"]) == 2
    assert "the settings run without it" in capsys.readouterr().err


def test_a_whole_run_without_the_dp_overlap_is_noted(capsys, tmp_path):
    assert main(["best", *LLAMA, "--emit", "megatron"]) == 0
    text = capsys.readouterr().out
    assert "    --tp-comm-overlap\n" not in text and "#   --tp-comm-overlap" in text  # to drop from a script
    script = tmp_path / "run.sh"
    script.write_text(text.replace("    --overlap-grad-reduce\n", ""))
    assert main(["rank", CONFIG, "--from", str(script), *RUN, "--json"]) == 2  # param gather needs it
    assert "--overlap-param-gather" in capsys.readouterr().err
    script.write_text(text.replace("    --overlap-grad-reduce\n", "").replace("    --overlap-param-gather\n", ""))
    assert main(["rank", CONFIG, "--from", str(script), *RUN, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("--overlap-grad-reduce" in n for n in notes)


def test_mindformers_cannot_state_the_tp_overlap(capsys):
    assert main(["best", *LLAMA, "--tp-comm-overlap", "--emit", "mindformers"]) == 2
    assert "tp_comm_overlap" in capsys.readouterr().err


def test_a_sweep_with_tp_overlap_costs_every_row_as_a_model_built_with_it():
    from gpuknap import best_splits, sweep  # noqa: PLC0415
    from gpuknap.costs import estimate  # noqa: PLC0415
    from gpuknap.sweep import builder_of  # noqa: PLC0415

    source, grid = "gpuknap/examples/llama2_70b.json", {"stages": [4, 8], "tensor_parallel": [2, 8]}
    plain = {json.dumps(r["config"], sort_keys=True): r for r in
             sweep(source, grid, gpus=64, global_batch=64, top=None).rows}
    rows = sweep(source, grid, gpus=64, global_batch=64, top=None, tp_comm_overlap=True).rows
    builder, _, bucket, _ = builder_of(source, None, None, None, None, training={"tp_comm_overlap": True})
    assert rows
    for row in rows:
        model = builder(row["config"])
        assert model.costs.training.tp_comm_overlap
        found = best_splits(model, row["config"]["stages"], 1, "1f1b", bucket, backend="numpy")[0]
        assert list(found[0]) == row["counts"]
        run = estimate(model, found[0], model.option_names(found[0], found[2], None, 1))
        assert row["iteration_time_s"] == pytest.approx(run.iteration_time, rel=1e-12)
        assert row["iteration_time_s"] < plain[json.dumps(row["config"], sort_keys=True)]["iteration_time_s"]
    with pytest.raises(ValueError, match="tp_comm_overlap"):
        sweep(source, grid, gpus=64, global_batch=64, tp_comm_overlap="yes")


def test_a_run_without_data_parallelism_gets_no_dp_overlap_note(capsys, tmp_path):
    one = RUN[:RUN.index("--dp")] + ["--dp", "1"] + RUN[RUN.index("--dp") + 2:]
    assert main(["best", CONFIG, "--stages", "4", *one, "--emit", "megatron"]) == 0
    text = capsys.readouterr().out
    assert "--overlap-grad-reduce" not in text and "--overlap-param-gather" not in text
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert main(["rank", CONFIG, "--from", str(script), *one, "--json"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "overlap" in n]
