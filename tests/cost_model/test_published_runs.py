"""Predicted vs published (bench/cost_model_validation.py prints the full table).

The bounds below are the accuracy this model reaches with one profile per device and no per-row
factor; a change that makes any row worse fails here. RESULTS.md explains the Qwen3 rows.
"""

import pytest

from trex.cost_model.validation import compare_all, layers_per_chunk_from_layout, published_runs
from trex.errors import TrexError


@pytest.fixture(scope="module")
def rows():
    return {c.id: c for c in compare_all()}


def test_every_published_row_is_estimated(rows):
    assert set(rows) == {row["id"] for row in published_runs()}
    assert all(c.estimate.feasible for c in rows.values())  # every published configuration fits in memory


@pytest.mark.parametrize("row", ["K22B", "K175B", "K530B", "K1T"])
def test_megatron_gpt_step_times_within_10_percent(rows, row):
    assert abs(rows[row].error) < 0.10


@pytest.mark.parametrize("row", ["DSV3-H100", "PANGU-135B"])
def test_deepseek_v3_throughput_and_pangu_mfu_within_10_percent(rows, row):
    assert abs(rows[row].error) < 0.10


def test_qwen3_cross_node_deepep_row_within_22_percent(rows):
    # +17.6 % while the setup wrongly had Megatron's pipeline sends blocking; the runs overlap them
    # (Megatron's default since 2023-10, see published_setups.toml): +20.6 %. RESULTS.md explains the rest.
    assert abs(rows["Q3-A"].error) < 0.22


def test_the_qwen3_rows_are_bound_by_the_device_at_the_measured_host_cost_per_op(rows):
    # host ops x 13.5 us stay under the device time of every layer: the host model changes nothing here
    assert all(rows[i].estimate.breakdown.host_wait_s == 0.0 for i in ("Q3-A", "Q3-B", "Q3-C"))


def test_the_validation_command_issue_3_names_prints_every_row_and_the_summary(capsys):
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "cost_model_validation.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["rows"]] == [row["id"] for row in published_runs()]
    assert {"mean_abs_error", "worst_abs_error", "qwen3_order_kept"} <= set(data)


def test_interleaving_and_layout_are_read_from_the_megatron_layout_string():
    assert layers_per_chunk_from_layout("Et|(tt|)*30mL", 32, 61) == (1,) + (2,) * 30 + (0,)
    with pytest.raises(TrexError, match="places 60 layers, the model has 61"):
        layers_per_chunk_from_layout("Et|(tt|)*29t|mL", 32, 61)


def test_extra_rows_are_estimated_with_their_cited_setups_and_kept_out_of_the_summary(capsys):
    import json
    import runpy
    from pathlib import Path

    from trex.cost_model.validation import extra_published_runs, published_setups

    extra = compare_all(extra=True)
    ids = [row["id"] for row in extra_published_runs()]
    assert [c.id for c in extra] == ids and len(ids) >= 6
    assert not set(ids) & {row["id"] for row in published_runs()}
    setups = published_setups()
    assert all(setups[i]["source"] for i in ids)
    assert all(c.estimate.feasible for c in extra)
    script = Path(__file__).resolve().parents[2] / "bench" / "cost_model_validation.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--json", "--extended"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["extra_rows"]] == ids
    assert [r["id"] for r in data["rows"]] == [row["id"] for row in published_runs()]  # the summary's rows only


def test_long_context_rows_of_the_qwen3_layout_stay_within_16_percent():
    # Q3-C's layout (tp4 pp8 vpp4 ep8, DeepEP) at 16K-128K tokens: the per-layer work grows, and the model
    # lands within +10..+16 % where it is +89 % at 4K (RESULTS.md section 1.1).
    extra = {c.id: c for c in compare_all(extra=True)}
    for i in ("Q3-LC16K", "Q3-LC32K", "Q3-LC64K", "Q3-LC128K"):
        assert abs(extra[i].error) < 0.16, (i, extra[i].error)


def test_q3a_layout_on_the_megatron_bridge_releases_stays_within_7_percent():
    # Q3-A's layout in FP8 with the alltoall dispatcher and the EP all-to-all overlap, as NVIDIA's
    # Megatron-Bridge recipes ran it from NeMo 25.11 to 26.04 (published 233-253 TFLOP/s; one setup)
    extra = {c.id: c for c in compare_all(extra=True)}
    ids = [i for i in extra if i.startswith("Q3-NB")]
    assert len(ids) == 5
    for i in ids:
        assert abs(extra[i].error) < 0.07, (i, extra[i].error)
        assert extra[i].estimate.plan.fp8_recipe == "tensorwise"


def test_the_rows_priced_about_twice_too_fast_are_the_ones_whose_experts_get_few_rows():
    # Q3-B, Q3-C (Megatron main, May 2025) and GPT-OSS 120B EP8 (Megatron-Bridge 26.02-26.04) ran 1.8-2.2x the priced
    # step; every one of them gives each local expert at most 1024 rows per micro-batch, and their estimates say so. Every
    # other MoE row (2048-4096 rows per expert) is within 35 % and carries no such note (RESULTS.md section 1.5).
    rows = {c.id: c for c in (*compare_all(), *compare_all(extra=True))}
    flagged = {i for i, c in rows.items() if any("rows per micro-batch" in n for n in c.estimate.notes)}
    assert flagged == {"Q3-B", "Q3-C", "GOSS-NB2602", "GOSS-NB2602.01", "GOSS-NB2604", "GOSS-NB2604.01"}
    for i in flagged:
        c = rows[i]
        slowdown = (c.published / c.predicted) if c.metric == "step_time_s" else (c.predicted / c.published)
        assert 1.7 < slowdown < 2.3, (i, slowdown)
    moe_rows = [c for i, c in rows.items() if i not in flagged and c.estimate.plan.ep > 1]
    assert moe_rows and all(abs(c.error) < 0.35 for c in moe_rows)


def test_dense_fp8_rows_are_priced_fast_by_at_most_18_percent():
    # Llama 3 70B / 3.1 405B in FP8 current scaling (RESULTS.md section 1.4): still optimistic, as every FP8
    # estimate says, by less than before the recipe's split accumulation and amax passes were priced (+20..+29 %)
    extra = {c.id: c for c in compare_all(extra=True)}
    ids = [i for i in extra if i.startswith(("L70-NB", "L405-NB"))]
    assert len(ids) == 6
    for i in ids:
        assert 0 < extra[i].error < 0.18, (i, extra[i].error)


def test_layer_executions_split_the_step_into_layers_and_the_rest(rows):
    from trex.cost_model.validation import layer_executions

    assert layer_executions(rows["DSV3-H100"]) is None  # dense and MoE layers: no single layer time
    k22 = rows["K22B"]
    executions = layer_executions(k22)
    assert executions is not None
    assert executions.count == k22.estimate.plan.microbatches * 48  # pp=1: every layer on the one stage
    # the published step minus the rest of the step, per execution: published = predicted * ratio overall
    rest = k22.estimate.step_time_s - executions.count * executions.predicted_s
    assert rest > 0
    assert executions.count * executions.published_s + rest == pytest.approx(k22.published)
    assert executions.ratio > 1.0  # K22B is predicted fast (-8 %)


def test_explain_prints_one_row_as_priced_down_to_its_ops(capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "cost_model_validation.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--explain", "Q3-C"]) == 0
    out = capsys.readouterr().out
    assert "Q3-C: published 167 TFLOP/s" in out and "dispatcher=deepep" in out and "per layer execution" in out
    assert (
        "pipeline: 8 devices x 4 chunks" in out
        and "layer moe (x94 in the model)" in out
        and "experts.grouped_mm" in out
    )
    assert main(["--explain", "L70-NB2604"]) == 0  # further rows too
    assert "tp_comm_overlap=True" in capsys.readouterr().out
    assert main(["--explain", "Q3-Z"]) == 2
    assert "no published row 'Q3-Z'" in capsys.readouterr().err
