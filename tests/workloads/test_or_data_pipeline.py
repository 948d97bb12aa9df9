"""The whole run: planning, the output records, decontamination and deduplication, and a
resumable, deterministic run (killed mid-way and finished by another process)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_or_data_support import DATA_DIR, requires_bench, runner  # noqa: F401 - runner is a fixture

from trex.errors import TrexError
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.decontamination import BenchmarkIndex
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.merge import Merger
from trex.workloads.or_data.pipeline import TASK_SLOTS, plan
from trex.workloads.or_data.records import validate_sft_record
from trex.workloads.or_data.reverify import reverify
from trex.workloads.or_data.shards import ShardStore, open_manifest
from trex.workloads.or_data.synthesis import synthesize

SMALL = SynthConfig(seed=3, shard_size=4)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 12-sample run, made in-process with the programmatic teacher only."""
    out = tmp_path_factory.mktemp("ordata")
    bench = DATA_DIR if DATA_DIR.is_dir() else None
    synthesize(SMALL, out, 12, bench_dir=bench, progress=False)
    return out


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_plans_balance_families_and_task_slots_in_every_block():
    config = SynthConfig(seed=9)
    plans = [plan(config, index) for index in range(len(FAMILIES) * len(TASK_SLOTS))]
    assert set(Counter(p.family for p in plans).values()) == {len(TASK_SLOTS)}
    slots = Counter((p.category, p.variant) for p in plans if p.status == "optimal")
    categories = Counter(p.category for p in plans)
    assert set(categories.values()) == {len(plans) // 4}
    assert len(slots) == 6


def test_status_shares_follow_the_configuration():
    config = SynthConfig(seed=1, infeasible_share=0.1, unbounded_share=0.05)
    statuses = Counter(plan(config, index).status for index in range(3000))
    assert 0.08 < statuses["infeasible"] / 3000 < 0.12
    assert 0.035 < statuses["unbounded"] / 3000 < 0.065
    assert all(
        plan(config, index).variant not in ("repair", "what_if")
        for index in range(3000)
        if plan(config, index).status != "optimal"
    )


def test_every_output_record_follows_the_schema_and_re_verifies(run_dir, runner):
    sft = records(run_dir / "sft.jsonl")
    cpt = records(run_dir / "cpt.jsonl")
    assert len(sft) == len(cpt) == 12
    assert all(not validate_sft_record(record) for record in sft)
    assert all(set(document) == {"text"} and document["text"].startswith("# ") for document in cpt)
    assert len({record["meta"]["id"] for record in sft}) == 12
    report = reverify(sft, runner)
    assert report.ok, report.failures


def test_the_statistics_describe_what_was_written(run_dir):
    stats = json.loads((run_dir / "stats.json").read_text())
    sft = records(run_dir / "sft.jsonl")
    assert stats["samples"] == 12 and sum(stats["families"].values()) == 12
    assert stats["tasks"] == dict(sorted(Counter(r["meta"]["task"] for r in sft).items()))
    assert stats["verification"]["instances"] >= 12 and 0 < stats["verification"]["pass_share"] <= 1
    assert stats["tokens"]["sample"]["max"] >= stats["tokens"]["sample"]["p50"] > 0
    assert "| family | count | share |" in (run_dir / "stats.md").read_text()


def test_schema_validation_names_what_is_wrong(run_dir):
    record = records(run_dir / "sft.jsonl")[0]
    broken = copy.deepcopy(record)
    del broken["meta"]["lp"]
    broken["messages"].reverse()
    problems = validate_sft_record(broken)
    assert any("system, user, assistant" in p for p in problems) and any("missing ['lp']" in p for p in problems)
    inconsistent = copy.deepcopy(record)
    inconsistent["meta"]["status"] = "infeasible"
    inconsistent["meta"]["objective"] = 12.0
    assert any("objective must be set exactly when" in p for p in validate_sft_record(inconsistent))


def test_sft_records_load_with_hf_datasets(run_dir):
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(run_dir / "sft.jsonl"), split="train")
    assert len(loaded) == 12 and loaded[0]["messages"][0]["role"] == "system"


def _merge(results, bench: BenchmarkIndex | None, n: int = 100) -> Merger:
    merger = Merger(n, bench)
    merger.feed(results)
    return merger


def shard_results(run_dir: Path) -> list[dict]:
    store = ShardStore(run_dir, SMALL.shard_size)
    return [result for shard in range(3) for result in store.read(shard)]


def test_exact_and_near_duplicates_are_removed_in_favour_of_the_first(run_dir):
    results = [result for result in shard_results(run_dir) if result["result"] == "emitted"]
    twin = copy.deepcopy(results[0])
    near = copy.deepcopy(results[1])
    prompt = near["sft"]["messages"][1]["content"]
    near["sft"]["messages"][1]["content"] = prompt.replace(".", ";", 1)
    near["sft"]["messages"][2]["content"] += "\nA closing remark."
    near["cpt"]["text"] += "\nA closing remark."
    merger = _merge([*results, twin, near], None)
    assert merger.removed == Counter({"exact_duplicate": 1, "near_duplicate": 1})
    assert len(merger.sft) == len(results)


def test_decontamination_removes_a_sample_that_copies_a_benchmark_text(run_dir, tmp_path):
    results = [result for result in shard_results(run_dir) if result["result"] == "emitted"]
    stolen = results[2]["sft"]["messages"][1]["content"]
    (tmp_path / "bench.jsonl").write_text(json.dumps({"en_question": stolen[:600], "en_answer": "1"}) + "\n")
    merger = _merge(results, BenchmarkIndex.from_dir(tmp_path))
    assert merger.removed == Counter({"contaminated": 1})
    report = merger.contamination.to_json()
    assert report["by_file"] and next(iter(report["by_file"])) == "bench.jsonl"
    assert report["examples"][0]["id"] == results[2]["sft"]["meta"]["id"]


@requires_bench
def test_generated_text_shares_no_13_gram_with_any_benchmark_file(run_dir):
    report = json.loads((run_dir / "decontamination.json").read_text())
    assert report["benchmarks"]["ngram"] == 13
    indexed = report["benchmarks"]["texts_indexed"]
    assert {"NL4OPT.json", "OptiBench.json", "orlm_predictions/NL4OPT.executed.jsonl"} <= set(indexed)
    assert report["checked"] == 24 and report["flagged"] == 0


def test_a_run_with_other_settings_is_not_resumed(tmp_path):
    open_manifest(tmp_path, SynthConfig(seed=1).to_json())
    assert open_manifest(tmp_path, SynthConfig(seed=1).to_json()) is True
    with pytest.raises(TrexError, match="seed"):
        open_manifest(tmp_path, SynthConfig(seed=2).to_json())


def test_a_larger_n_extends_a_finished_run_without_changing_its_prefix(tmp_path):
    first = synthesize(SMALL, tmp_path, 5, progress=False)
    prefix = (tmp_path / "sft.jsonl").read_text().splitlines()
    second = synthesize(SMALL, tmp_path, 9, progress=False)
    extended = (tmp_path / "sft.jsonl").read_text().splitlines()
    assert extended[:5] == prefix and len(extended) == 9
    assert second.shards_reused >= first.shards_made - 1


def test_shard_files_appear_whole_and_leftovers_of_killed_writers_are_cleaned(tmp_path):
    store = ShardStore(tmp_path, 2)
    store.directory.mkdir(parents=True)
    leftover = store.directory / ".shard-000000.jsonl.123.tmp"
    leftover.write_text("{partial")
    store.clean_temporaries()
    assert not leftover.exists()
    with pytest.raises(ValueError, match="indices 2..3"):
        store.write(1, [{"index": 2}])
    store.write(1, [{"index": 2}, {"index": 3}])
    assert store.done(1) and not store.done(0)


def _synth(out: Path, workers: int, hash_seed: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-c",
        "import sys; from trex.cli import main; sys.exit(main(sys.argv[1:]))",
        "data",
        "synth",
        "--n",
        "16",
        "--out",
        str(out),
        "--seed",
        "4",
        "--shard-size",
        "3",
        "--workers",
        str(workers),
        "--no-progress",
        "--no-decontaminate",
        "--json",
    ]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_run_resumes_to_the_same_output_as_an_uninterrupted_one(tmp_path):
    """Run A: one worker, uninterrupted. Run B: two worker processes, another hash seed, its main
    process SIGKILLed after the first shard (the workers must then end by themselves), then
    started again. Same seed, so the outputs must match byte for byte."""
    reference = _synth(tmp_path / "a", 1, "1")
    interrupted = _synth(tmp_path / "b", 2, "2")
    shards = tmp_path / "b" / "shards"
    deadline = time.monotonic() + 120
    while not (shards.is_dir() and list(shards.glob("shard-*.jsonl"))) and time.monotonic() < deadline:
        assert interrupted.poll() is None, interrupted.communicate()[1]
        time.sleep(0.05)
    workers = _children(interrupted.pid)
    os.kill(interrupted.pid, signal.SIGKILL)
    interrupted.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers and not any(_alive(pid) for pid in workers), "orphaned workers kept running"
    kept = sorted(path.name for path in shards.glob("shard-*.jsonl"))
    assert kept and not (tmp_path / "b" / "sft.jsonl").exists()
    resumed = _synth(tmp_path / "b", 2, "3")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    summary = json.loads(out)
    assert summary["finished"] and summary["shards_reused"] >= len(kept)
    out_a, err_a = reference.communicate(timeout=300)
    assert reference.returncode == 0, err_a
    for name in ("sft.jsonl", "cpt.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    ids = [record["meta"]["index"] for record in records(tmp_path / "b" / "sft.jsonl")]
    assert len(ids) == len(set(ids)) == 16 and ids == sorted(ids)


def test_the_last_needed_shard_is_made_in_pieces_and_the_output_is_that_of_whole_shards(tmp_path, monkeypatch):
    """With two workers the shard expected to complete the run is made in pieces merged as they
    come (the rest of it is not made once the merger is full); the outputs equal a one-worker run
    of whole shards, and every shard file written holds its whole index range."""
    from trex.workloads.or_data import synthesis
    from trex.workloads.or_data.config import PROGRAMMATIC_TEACHER, TeacherSpec

    config = SynthConfig(seed=4, shard_size=10)
    split_calls = []
    pieces = synthesis._pieces
    monkeypatch.setattr(
        synthesis, "_pieces", lambda indices, split: split_calls.append(split) or pieces(indices, split)
    )
    synthesize(config, tmp_path / "whole", 13, workers=1, progress=False)
    result = synthesize(config, tmp_path / "pieces", 13, workers=2, progress=False)
    assert True in split_calls  # the pool path split its last shard
    for name in ("sft.jsonl", "cpt.jsonl", "stats.json", "decontamination.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "pieces" / name).read_bytes(), name
    store = ShardStore(tmp_path / "pieces", config.shard_size)
    written = sorted(int(path.stem.split("-")[1]) for path in store.directory.glob("shard-*.jsonl"))
    assert written and result.shards_made == len(written)
    for shard in written:
        assert [item["index"] for item in store.read(shard)] == list(store.indices(shard))
    assert synthesis._pieces(range(10, 23), True) == [range(10, 15), range(15, 20), range(20, 23)]
    assert synthesis._pieces(range(10, 23), False) == [range(10, 23)]
    assert synthesis._pieces_are_independent(config)
    model = TeacherSpec("openai", "m", {"model": "x"})
    assert not synthesis._pieces_are_independent(SynthConfig(teachers=(PROGRAMMATIC_TEACHER, model)))
    assert not synthesis._pieces_are_independent(SynthConfig(reflection=model))


def test_a_config_travels_to_worker_processes_unchanged():
    from trex.workloads.or_data.config import PROGRAMMATIC_TEACHER, TeacherSpec
    from trex.workloads.or_data.selection import SelectionPolicy

    config = SynthConfig(
        seed=5,
        families=("knapsack", "lot_sizing"),
        shard_size=7,
        teachers=(
            PROGRAMMATIC_TEACHER,
            TeacherSpec("openai", "openai-1", {"base_url": "http://h:1", "model": "m", "api_key_env": "K"}),
        ),
        reflection=TeacherSpec("transformers", "reflection", {"model_path": "/models/judge"}),
        policy=SelectionPolicy(keep_unanimous=0.25, prefer=("openai-1",)),
        isolation="process",
    )
    assert SynthConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert "isolation" not in config.identity()


def test_cpt_documents_are_about_separate_instances_and_pass_the_sft_check(run_dir):
    sft = records(run_dir / "sft.jsonl")
    cpt = records(run_dir / "cpt.jsonl")
    stats = json.loads((run_dir / "stats.json").read_text())
    separation = stats["cpt_separation"]
    assert separation["cpt_checked"] == 12 and len(cpt) == 12 - (
        separation["dropped_same_instance"] + separation["dropped_shared_data_ngram"]
    )
    for record in sft:  # no SFT problem's LP file is in any CPT document
        body = "\n".join(line for line in record["meta"]["lp"].splitlines() if not line.startswith("\\"))
        assert not any(body.strip() in document["text"] for document in cpt)


def test_cpt_separation_drops_a_document_about_an_sft_instance_or_its_data():
    from trex.workloads.or_data.cpt_separation import lp_digest, separate

    lp = "Minimize\n obj: 3 x + 2 y\nSubject To\n c1: x + y >= 4\nEnd\n"
    sft = [
        {
            "meta": {"lp": lp, "what_if": None},
            "messages": [
                {},
                {"content": "A bakery makes 120 loaves and 45 cakes a day with 30 ovens and 17 bakers on 2 shifts."},
                {},
            ],
        }
    ]
    same_instance = {"text": "# Worked example\n\nsomething else entirely", "lp_digest": lp_digest("\\ c\n" + lp)}
    same_data = {
        "text": "Recall: a bakery makes 120 loaves and 45 cakes a day with 30 ovens and 17 bakers.",
        "lp_digest": "x",
    }
    boilerplate = {
        "text": "Each item has a value and uses resources and the plan must respect every limit it has.",
        "lp_digest": "y",
    }
    kept, report = separate(sft, [same_instance, same_data, boilerplate])
    assert kept == [{"text": boilerplate["text"]}]
    assert report.dropped_instance == [0] and report.dropped_text == [1]


def test_statistics_tallied_while_the_run_goes_on_equal_those_of_the_finished_outputs(run_dir):
    """`stats.Tally` does the report's per-sample work as the merger keeps each sample (during the
    run); the report and the CPT separation must be exactly those computed afterwards."""
    from trex.workloads.or_data.cpt_separation import Separation, separate
    from trex.workloads.or_data.stats import Tally, approximate_tokens, build_stats

    bench = BenchmarkIndex.from_dir(DATA_DIR, SMALL.ngram) if DATA_DIR.is_dir() else None
    after = _merge(shard_results(run_dir), bench, n=12)
    during = Merger(12, bench, tally=Tally(approximate_tokens, Separation()))
    during.feed(shard_results(run_dir))
    assert during.sft == after.sft and len(during.tally.prompt) == 12
    kept_during, report_during = during.tally.separate()
    kept_after, report_after = separate(after.sft, after.cpt)
    assert kept_during == kept_after and report_during == report_after
    during.cpt, after.cpt = kept_during, kept_after
    assert build_stats(during, approximate_tokens, "t") == build_stats(after, approximate_tokens, "t")
    assert json.loads((run_dir / "cpt.jsonl").read_text().splitlines()[0]) == kept_after[0]


def test_the_separation_membership_test_agrees_with_numpy_isin():
    import numpy as np

    from trex.workloads.or_data.cpt_separation import _any_in

    rng = np.random.default_rng(0)
    index = np.unique(rng.integers(0, 1 << 63, 500, dtype=np.uint64))
    for values in (index[:1], index[-1:], rng.integers(0, 1 << 63, 50, dtype=np.uint64), index[::97] + 1):
        assert _any_in(values, index) == bool(np.isin(values, index).any())
    assert not _any_in(index[:3], np.empty(0, dtype=np.uint64))
    assert _any_in(np.array([np.uint64((1 << 64) - 1)]), np.array([(1 << 64) - 1], dtype=np.uint64))
