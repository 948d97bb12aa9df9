"""The synthesis' speed-ups change no output: each cheaper path is compared with the straightforward
one it replaced (issue 21), and the CPT instance modes do what they say."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from test_or_data_support import generated, runner  # noqa: F401 - runner is a fixture

from trex.workloads.or_data import code_style, solve
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.cpt_separation import DATA_NUMBERS, _numeric_grams
from trex.workloads.or_data.decontamination import ngram_digests
from trex.workloads.or_data.dedup import _PRIME, _shingles
from trex.workloads.or_data.documents import CONCEPT, document_plan
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.program_runner import pool_for
from trex.workloads.or_data.seeds import stream
from trex.workloads.or_data.synthesis import synthesize
from trex.workloads.or_data.verify import verify_problem


def _texts(count: int = 40) -> list[str]:
    rng = random.Random(7)
    vocabulary = ["plant", "ships", "to", "the", "depot", "at", "cost", "of", "per", "unit", "and", "Week", "04:00"]
    texts = []
    for _ in range(count):
        words = [
            str(rng.randint(0, 999)) if rng.random() < 0.3 else rng.choice(vocabulary)
            for _ in range(rng.randint(0, 120))
        ]
        fence = "\n```python\nx = 12 + 34 + 56\n```\n" if rng.random() < 0.3 else " "
        texts.append(" ".join(words[:40]) + fence + " ".join(words[40:]))
    return texts


def test_data_grams_are_the_digests_of_every_gram_that_carries_enough_numbers():
    from trex.workloads.or_data.cpt_separation import _CLOCK, _FENCE

    for text in _texts():
        prose = _CLOCK.sub(" ", _FENCE.sub(" ", text))
        expected = [
            digest
            for digest, gram in ngram_digests(prose, 13)
            if sum(1 for word in gram if word.isdigit() and len(word) >= 2) >= DATA_NUMBERS
        ]
        assert list(_numeric_grams(text, 13)) == expected


def test_minhash_shingles_equal_one_digest_per_distinct_shingle():
    for text in _texts():
        words = re.findall(r"\w+", text.lower())
        grams = {" ".join(words[i : i + 5]) for i in range(max(1, len(words) - 5 + 1))}
        expected = sorted(
            int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "big") % _PRIME for gram in grams
        )
        assert sorted(_shingles(text).tolist()) == expected
        assert _shingles(text).dtype == np.uint64


@pytest.mark.parametrize("family", ["knapsack", "transportation", "network_flow", "lot_sizing"])
def test_one_renaming_pass_writes_what_the_renames_one_after_another_wrote(family):
    made = generated(family, 3)
    program = FAMILIES[family].program(made.data)
    for imports in code_style.IMPORTS:
        for model_name in code_style.MODEL_NAMES:
            for report in code_style.REPORTS:
                style = code_style.CodeStyle(imports, model_name, report)
                text = program if report == "helper" else code_style._report(program, report)
                if imports == "alias":
                    text = text.replace("from pyscipopt import Model, quicksum\n", "import pyscipopt as scip\n", 1)
                    text = code_style._rename(text, {"Model": "scip.Model", "quicksum": "scip.quicksum"})
                if model_name != "model":
                    text = code_style._rename(text, {"model": model_name})
                assert code_style.restyle(program, style) == text, style


def test_programs_run_in_the_worker_group_that_preloaded_their_library(runner):  # noqa: F811
    pyomo = "import pyomo.environ as pyo\nprint('Optimal objective value: 1')\n"
    assert pool_for(pyomo) == "pyomo" and pool_for("from pyomo.environ import *\n") == "pyomo"
    assert pool_for("import pulp\n# pyomo is not used\n") == "base"
    assert pool_for("from pyscipopt import Model\n") == "base"
    first = runner.run("print('Optimal objective value: 2')\n")
    second = runner.run(pyomo)
    assert first.outcome.objective == 2 and second.outcome.objective == 1
    assert set(runner._sandboxes) >= {"base", "pyomo"}


def test_the_pyomo_group_preloads_highspy_and_its_programs_solve_through_appsi_highs(runner):  # noqa: F811
    """The Pyomo programs solve with `SolverFactory("appsi_highs")`: their worker has highspy
    imported already (the import succeeded inside the sandbox), and a program solving through it
    in a child of that worker gets HiGHS's answer."""
    program = (
        "import pyomo.environ as pyo\n"
        "m = pyo.ConcreteModel()\n"
        "m.x = pyo.Var(domain=pyo.NonNegativeIntegers, bounds=(0, 10))\n"
        "m.y = pyo.Var(domain=pyo.NonNegativeReals)\n"
        "m.c = pyo.Constraint(expr=m.x + 2 * m.y <= 7)\n"
        "m.d = pyo.Constraint(expr=m.x - m.y <= 1)\n"
        "m.o = pyo.Objective(expr=3 * m.x + 2 * m.y, sense=pyo.maximize)\n"
        "r = pyo.SolverFactory('appsi_highs').solve(m, load_solutions=False)\n"
        "m.solutions.load_from(r)\n"
        "print(f'Optimal objective value: {pyo.value(m.o):.10g}')\n"
    )
    run = runner.run(program)
    assert "highspy" in runner.sandbox_for("pyomo")._pool.info["preloaded"]
    assert run.ok and run.outcome.objective == 13  # x = 3, y = 2


def test_an_lp_file_is_read_and_solved_once_and_its_copies_are_independent():
    lp = "Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x + 3 y <= 6\nBounds\n x <= 3\nGenerals\n y\nEnd\n"
    first = solve.solve_lp_text_highs(lp)
    first.values["x"] = -1.0  # a caller's change must not reach the memo
    second = solve.solve_lp_text_highs(lp)
    assert second.objective == pytest.approx(11.0) and second.values["x"] == pytest.approx(3.0)
    scip = solve.solve_lp_text_scip(lp)
    assert scip.objective == pytest.approx(11.0)
    assert solve.lp_counts_scip(lp) == (2, 1)
    solve._LP_MEMO.clear()  # from a fresh read, the same counts
    assert solve.lp_counts_scip(lp) == (2, 1)


def test_the_verifiers_highs_read_gives_the_solve_of_a_fresh_read_and_answers_the_judge(monkeypatch):
    """`solve.solve_read_highs` (the verifier's re-solve, from the read its read-back used) has the
    verdict of `solve_lp_text_highs` on a fresh read, for every family's MIP optimum, and a later
    `solve_lp_text_highs` of the same file (the judge's) is answered from it without a read."""
    from trex.workloads.or_data.lp_format import write_lp
    from trex.workloads.or_data.lp_structure import highs_read

    checked = 0
    for name, family in FAMILIES.items():
        model = family.linear_model(generated(name, 2).data)
        if not model.is_mip:
            continue
        lp = write_lp(model)
        solve._LP_MEMO.clear()
        fresh = solve.solve_lp_text_highs(lp)
        solve._LP_MEMO.clear()
        read = solve.solve_read_highs(highs_read(lp), lp)
        assert (read.status, read.objective) == (fresh.status, fresh.objective), name
        with monkeypatch.context() as patched:
            patched.setattr(solve, "_solve_lp_text_highs", lambda *_: pytest.fail("the file was read again"))
            again = solve.solve_lp_text_highs(lp)
        assert (again.status, again.objective) == (read.status, read.objective)
        checked += 1
    assert checked >= 5


def test_plain_branch_and_bound_reads_every_family_to_the_verdict_of_scips_defaults():
    """The LP-file check solves by plain branch and bound (`solve.plain_branch_and_bound`): on every
    family's instances, optimal, infeasible and unbounded, the same status and objective as SCIP
    with its default presolving, heuristics and cuts."""
    from pyscipopt import Model

    from trex.workloads.or_data.lp_format import write_lp
    from trex.workloads.or_data.outcome import Outcome

    def default_scip(lp: str) -> solve.SolveResult:
        with solve.lp_file(lp) as path:
            scip = Model()
            scip.hideOutput()
            scip.readProblem(path)
        return solve._solve_read_scip(scip)

    cases = [(name, seed, "optimal") for name in FAMILIES for seed in (3,)]
    cases += [(name, 5, status) for name in FAMILIES for status in ("infeasible", "unbounded")]
    checked = set()
    for name, seed, status in cases:
        if status != "optimal" and status not in FAMILIES[name].statuses:
            continue
        made = generated(name, seed, status)
        lp = write_lp(FAMILIES[name].linear_model(made.data))
        plain, default = solve.solve_lp_text_scip(lp), default_scip(lp)
        assert plain.status == default.status, (name, seed, status)
        assert Outcome(plain.status, plain.objective).matches(Outcome(default.status, default.objective))
        checked.add(default.status)
    assert checked == {"optimal", "infeasible", "unbounded"}


def test_a_cpt_instance_whose_document_shows_no_program_is_verified_without_running_it(runner):  # noqa: F811
    seeds = [seed for seed in range(40) if document_plan(stream(seed, 0, "cpt_layout")) == CONCEPT]
    assert seeds, "a concept document is drawn 30% of the time"
    made = generated("knapsack", 11)
    before = runner.runs
    problem = verify_problem(FAMILIES["knapsack"], made.data, made.status, made.note, runner, run_program=False)
    assert runner.runs == before and "program" not in problem.checks and problem.program
    checked = verify_problem(FAMILIES["knapsack"], made.data, made.status, made.note, runner)
    assert checked.checks == (*problem.checks, "program") and checked.program == problem.program


def _run(tmp_path: Path, mode: str) -> tuple[list[dict], list[dict], dict]:
    config = SynthConfig(seed=4, families=("knapsack", "production_planning"), shard_size=3, cpt_instances=mode)
    out = tmp_path / mode
    synthesize(config, out, 3, progress=False)
    read = [
        [json.loads(line) for line in (out / name).read_text(encoding="utf-8").splitlines()]
        for name in ("sft.jsonl", "cpt.jsonl")
    ]
    return read[0], read[1], json.loads((out / "stats.json").read_text(encoding="utf-8"))


def test_cpt_instance_modes(tmp_path):
    sft, cpt, stats = _run(tmp_path, "none")
    assert len(sft) == 3 and cpt == [] and stats["cpt_separation"] is None
    same_sft, same_cpt, stats = _run(tmp_path, "same")
    assert same_sft == sft, "the CPT mode never changes the SFT samples"
    assert len(same_cpt) == 3 and stats["cpt_separation"] is None
    for record, document in zip(sft, same_cpt, strict=True):  # about the sample's own instance
        lp = "\n".join(line for line in record["meta"]["lp"].splitlines() if not line.startswith("\\")).strip()
        program = record["meta"]["program"].strip()
        shown = ("```lp" in document["text"], "```python" in document["text"])
        assert (lp in document["text"]) == shown[0] and (program in document["text"] or not shown[1])
    assert "cpt_instances" not in SynthConfig().identity(), "runs made before the option are the same runs"
    assert SynthConfig(cpt_instances="same").identity()["cpt_instances"] == "same"
    with pytest.raises(Exception, match="unknown CPT instance mode"):
        SynthConfig(cpt_instances="both")


def test_an_emptied_scip_instance_solves_every_family_like_a_new_one():
    """`scip_instances.empty_scip` reuses one SCIP instance per purpose (`freeProb` between
    problems): on every family's instances, optimal, infeasible and unbounded, solved in turn in
    the reused instance, the same status, objective, values, branch-and-bound nodes and LP
    iterations as in a new instance, for the model solves and for the LP-file check."""
    from pyscipopt import Model

    from trex.workloads.or_data.lp_format import write_lp
    from trex.workloads.or_data.scip_instances import empty_scip

    def path(scip) -> tuple:
        return scip.getStatus(), scip.getNNodes(), scip.getNLPIterations()

    def new_instance(settings):
        scip = Model()
        scip.hideOutput()
        settings(scip)
        return scip

    cases = [(name, seed, "optimal") for name in FAMILIES for seed in (3, 4)]
    cases += [(name, 5, status) for name in FAMILIES for status in ("infeasible", "unbounded")]
    statuses = set()
    for name, seed, status in cases:
        if status != "optimal" and status not in FAMILIES[name].statuses:
            continue
        model = FAMILIES[name].linear_model(generated(name, seed, status).data)
        with empty_scip("model", model.name, solve._model_solve_settings) as scip:
            reused = solve._build_and_solve(scip, model, with_objective=True), path(scip)
        fresh_scip = new_instance(solve._model_solve_settings)
        fresh = solve._build_and_solve(fresh_scip, model, with_objective=True), path(fresh_scip)
        assert reused == fresh, (name, seed, status)
        statuses.add(reused[0].status)
        with solve.lp_file(write_lp(model)) as lp_path:
            with empty_scip("lp_file", "lp", solve._lp_file_settings) as scip:
                scip.readProblem(lp_path)
                reused = solve._solve_read_scip(scip), path(scip)
            fresh_scip = new_instance(solve._lp_file_settings)
            fresh_scip.readProblem(lp_path)
            fresh = solve._solve_read_scip(fresh_scip), path(fresh_scip)
        assert reused == fresh, (name, seed, status, "lp file")
    assert statuses >= {"optimal", "infeasible"}


def test_a_failed_solve_drops_the_reused_instance():
    from trex.workloads.or_data import scip_instances

    with pytest.raises(KeyboardInterrupt), scip_instances.empty_scip("test", "first", lambda scip: None) as scip:
        first = scip
        raise KeyboardInterrupt
    with scip_instances.empty_scip("test", "second", lambda scip: None) as scip:
        assert scip is not first and scip.getProbName() == "second"
    with scip_instances.empty_scip("test", "third", lambda scip: None) as again:
        assert again is scip and again.getProbName() == "third" and again.getNVars() == 0


def test_the_overlap_of_integer_gram_ids_equals_the_overlap_of_the_grams():
    from collections import Counter

    from trex.workloads.or_data import diversity

    def by_tuples(texts: list[str]) -> float:
        sets = [diversity.grams(text) for text in texts]
        frequency = Counter(gram for gram_set in sets for gram in gram_set)
        shares = [sum(1 for gram in gram_set if frequency[gram] > 1) / len(gram_set) for gram_set in sets if gram_set]
        return round(sum(shares) / len(shares), 4) if shares else 0.0

    texts = _texts(60)
    for subset in (texts, texts[:4], texts[10:25], [], ["one two"]):
        assert diversity.overlap(subset) == by_tuples(subset)
    assert diversity.overlap_at(texts, 15) == round(sum(by_tuples(sample) for sample in _draws(texts, 15)) / 8, 4)


def test_grams_are_the_slices_at_every_position():
    from trex.workloads.or_data import diversity

    for text in ["", "one", "one two three four", *_texts(20)]:
        tokens = diversity.words(text)
        for n in (1, 2, 5, 13):
            assert diversity.grams(text, n) == {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def test_a_tallied_samples_tokens_are_those_of_its_messages_joined():
    """`Tally` adds the approximate counts of a sample's messages instead of counting them joined:
    the word-piece pattern never matches the joining newline, so the sums are the joined counts."""
    from trex.workloads.or_data.stats import Tally, approximate_tokens

    tally = Tally(approximate_tokens)
    system = "You are helpful.  "
    samples = [(" lead\n", "x=1,y:2 \t"), ("a-b", "c_d.e"), ("", ""), ("end.", "\nstart")] + [
        (text, text[::-1]) for text in _texts(10)
    ]
    for prompt, answer in samples:
        messages = [{"content": system}, {"content": prompt}, {"content": answer}]
        tally.keep({"messages": messages}, None)
        joined = "\n".join(message["content"] for message in messages)
        assert tally.sample[-1] == approximate_tokens(joined)
        assert tally.prompt[-1] == approximate_tokens(prompt) and tally.answer[-1] == approximate_tokens(answer)


def _draws(texts: list[str], k: int) -> list[list[str]]:
    rng = random.Random(0)
    return [rng.sample(list(texts), k) for _ in range(8)]


def _rename_by_tokenize(text: str, names: dict[str, str]) -> str:
    """The renaming as `tokenize` does it (what `code_style._rename` did before its own scanner)."""
    import io
    import tokenize

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.split("\n")
    edits = []
    previous = None
    for token in tokens:
        if token.type == tokenize.NAME and token.string in names and not (previous and previous.string == "."):
            edits.append((token.start[0], token.start[1], token.end[1], names[token.string]))
        elif token.type == tokenize.STRING and token.string[:1] in "fF" and token.start[0] == token.end[0]:
            changed = token.string
            for old, new in names.items():
                pattern = re.compile(r"(?<![\w.])" + re.escape(old) + r"(?=[.(\[])")
                changed = re.sub(r"\{[^{}]*\}", lambda field, p=pattern, n=new: p.sub(n, field.group(0)), changed)
            if changed != token.string:
                edits.append((token.start[0], token.start[1], token.end[1], changed))
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            previous = token
    for row, start, end, new in sorted(edits, reverse=True):
        lines[row - 1] = lines[row - 1][:start] + new + lines[row - 1][end:]
    return "\n".join(lines)


TRICKY = '''import pyscipopt as scip
model = scip.Model("model")  # model: a comment naming model
x = model.addVar(name='model.x'); y = [model, model.model, ...]
text = """model
model""" + r'model\\' + b"model".decode() + rb'model' + f"{model.getVal(x):.3g} model {x}" + F'{ model.data }'
z = 1.5e-3 + 0x1F + 2j + .5 + 1_000.0; model .addCons(x <= 3); w = \\
    model
lam = lambda model: model.getObjVal()
def f(model=model, *args, **kw) -> "model":
    return model[0] if model else None
m2 = model;model=3; print(f"""{model}""", fr"{model.x}", u"model")
'''


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_token_scanner_renames_what_tokenize_renames(family):
    names = {"model": "mdl", "Model": "scip.Model", "quicksum": "scip.quicksum", "x": "x_"}
    texts = [TRICKY]
    for seed in range(3):
        program = FAMILIES[family].program(generated(family, seed).data)
        texts.append(program)
        texts += [code_style.restyle(program, code_style.style_for(program, library)) for library in ("pulp", "pyomo")]
    for text in texts:
        for subset in (names, {"model": "prob"}, {"quicksum": "scip.quicksum"}):
            assert code_style._rename(text, subset) == _rename_by_tokenize(text, subset)
