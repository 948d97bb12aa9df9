"""Deployment search: the best feasible (TP, instances) per machine type, runners-up with reasons,
clear infeasibility."""

from __future__ import annotations

import json

import pytest

from trex.cli import main
from trex.cost_model.model_spec import get_model_spec
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.cluster_spec import cluster_from_dict
from trex.workloads.serving.deployment import load_instances, plan_deployment, save_plan
from trex.workloads.serving.errors import InfeasibleError
from trex.workloads.serving.workload import save_trace, sharegpt_like, workload_stats

MIX = {"machines": [{"device": "h100", "count": 8}, {"device": "a100", "count": 8}]}


@pytest.fixture(scope="module")
def stats():
    return workload_stats(sharegpt_like(300, 10.0, seed=0))


def test_plan_chooses_a_feasible_deployment_per_machine_type(stats):
    plan = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO())
    machines = {o.machine for o in plan.best.choices}
    assert machines == {"h100", "a100"}
    for option in plan.best.choices:
        assert option.tp >= 2  # 70B in BF16 does not fit one 80 GB device
        assert option.instances * option.tp <= 8
        assert option.estimate.tpot_s <= plan.slo.tpot_s and option.estimate.ttft_s <= plan.slo.ttft_s
    rejected = [o for o in plan.options if not o.feasible]
    assert any(o.tp == 1 and "does not fit" in o.reason for o in rejected)


def test_runners_up_rank_below_the_best_and_say_why(stats):
    plan = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO())
    assert plan.runners_up
    throughputs = [plan.best.output_tok_s] + [d.output_tok_s for d, _ in plan.runners_up]
    assert throughputs == sorted(throughputs, reverse=True)
    for _, why in plan.runners_up:
        assert "less throughput" in why and "tok/s" in why


def test_tight_tpot_slo_rules_out_slow_devices_first(stats):
    loose = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO(3.0, 0.15))
    tight = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO(3.0, 0.03))
    assert tight.best.output_tok_s < loose.best.output_tok_s
    assert all(o.estimate.tpot_s <= 0.03 for o in tight.best.choices)


def test_infeasible_slo_names_every_option_and_the_fix(stats):
    with pytest.raises(InfeasibleError) as caught:
        plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO(3.0, 0.001))
    message = str(caught.value)
    assert "h100: 2 x TP4" in message and "TPOT" in message and "SLO 1 ms" in message
    assert "relax the SLOs" in message


def test_a_dtype_one_machine_type_lacks_rules_out_that_type_only(stats):
    mix = {"machines": [{"device": "h100", "count": 8}, {"device": "ascend-910b", "count": 8}]}
    plan = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(mix), stats, SLO(), weight_dtype="fp8")
    assert {o.machine for o in plan.best.choices} == {"h100"}
    assert all("no fp8 GEMMs" in o.reason for o in plan.options if o.machine == "ascend-910b")


def test_plan_file_feeds_the_simulator(tmp_path, stats):
    plan = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO())
    instances = load_instances(save_plan(plan, tmp_path / "plan.json"))
    assert [i.name for i in instances] == [i.name for i in plan.best.instances()]
    assert instances[0].latency == plan.best.instances()[0].latency


def test_cli_plan_json_and_trace(tmp_path, capsys):
    cluster = tmp_path / "mix.toml"
    cluster.write_text('[[machines]]\ndevice = "h100"\ncount = 8\n\n[[machines]]\ndevice = "a100"\ncount = 8\n')
    trace = save_trace(sharegpt_like(100, 5.0, seed=1), tmp_path / "trace.jsonl")
    assert (
        main(["serve", "plan", "--cluster", str(cluster), "--model", "llama3-70b", "--workload", str(trace), "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["predicted"]["output_tok_s"] > 0 and data["instances"] and data["runners_up"]


def test_cli_reports_unknown_device_and_infeasible_slo(tmp_path, capsys):
    cluster = tmp_path / "bad.toml"
    cluster.write_text('[[machines]]\ndevice = "tpu-v9"\ncount = 8\n')
    assert main(["serve", "plan", "--cluster", str(cluster), "--model", "llama3-70b"]) == 2
    assert "unknown device 'tpu-v9'" in capsys.readouterr().err
    cluster.write_text('[[machines]]\ndevice = "a100"\ncount = 8\n')
    assert main(["serve", "plan", "--cluster", str(cluster), "--model", "llama3-70b", "--tpot-slo", "0.001"]) == 2
    assert "no deployment of llama3-70b" in capsys.readouterr().err


def test_each_machine_type_gets_its_serving_engine_s_batch_limits(stats):
    from trex.cost_model.devices import BUILTIN_DEVICES
    from trex.workloads.serving.instance_model import EngineLimits, engine_defaults

    assert engine_defaults(BUILTIN_DEVICES["h100"]).max_num_seqs == 1024  # vLLM: >= 70 GiB, not an A100
    assert engine_defaults(BUILTIN_DEVICES["a100"]) == EngineLimits(2048, 256)
    assert engine_defaults(BUILTIN_DEVICES["ascend-910b4"]).max_num_seqs == 256
    plan = plan_deployment(get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO())
    assert {o.machine: o.spec.limits.max_num_seqs for o in plan.best.choices} == {"h100": 1024, "a100": 256}
    forced = plan_deployment(
        get_model_spec("llama3-70b"), cluster_from_dict(MIX), stats, SLO(), limits=EngineLimits(max_num_seqs=64)
    )
    assert {o.spec.limits.max_num_seqs for o in forced.best.choices} == {64}
