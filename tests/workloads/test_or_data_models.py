"""The flat model, the LP writer, solving, and the solver-independent certificate checks."""

from __future__ import annotations

import pytest

from trex.workloads.or_data.certificates import check_ray, check_solution, dual_bound, find_dual, find_farkas, find_ray
from trex.workloads.or_data.linear_model import ModelBuilder, lp_name
from trex.workloads.or_data.lp_format import format_number, write_lp
from trex.workloads.or_data.solve import solve_lp_text_highs, solve_lp_text_scip, solve_model


def transport(supply_a: float = 30.0):
    """Two plants, three cities; optimum 267.5 with the default supply."""
    b = ModelBuilder("transport")
    cost = {("a", "x"): 4, ("a", "y"): 6, ("a", "z"): 9, ("b", "x"): 5, ("b", "y"): 3, ("b", "z"): 7.5}
    ship = {route: b.var(lp_name("ship", *route)) for route in cost}
    for plant, supply in (("a", supply_a), ("b", 40.0)):
        b.row(lp_name("supply", plant), {ship[plant, city]: 1 for city in "xyz"}, "<=", supply)
    for city, demand in (("x", 20), ("y", 25), ("z", 15)):
        b.row(lp_name("demand", city), {ship[plant, city]: 1 for plant in "ab"}, ">=", demand)
    b.minimize({ship[route]: c for route, c in cost.items()})
    return b.build()


def knapsack():
    """max 5a + 4b + 3c, 2a + 3b + c <= 4, binaries: optimum 8 (a and c)."""
    b = ModelBuilder("knapsack")
    for name in "abc":
        b.var(name, "binary")
    b.row("weight", {"a": 2, "b": 3, "c": 1}, "<=", 4)
    b.maximize({"a": 5, "b": 4, "c": 3})
    return b.build()


def test_builder_merges_repeated_terms_and_drops_zero_coefficients():
    b = ModelBuilder("m")
    b.var("x")
    b.var("y")
    b.row("r", [("x", 2), ("y", 1), ("x", -2)], "<=", 5)
    assert b.build().rows[0].terms == (("y", 1.0),)


def test_builder_refuses_undeclared_variables_duplicate_rows_and_non_identifiers():
    b = ModelBuilder("m")
    b.var("x")
    with pytest.raises(ValueError, match="undeclared"):
        b.row("r", {"nope": 1}, "<=", 1)
    with pytest.raises(ValueError, match="not an LP identifier"):
        b.var("has space")
    b.row("r", {"x": 1}, "<=", 1)
    b.row("r", {"x": 1}, ">=", 0)
    with pytest.raises(ValueError, match="duplicate row"):
        b.build()


def test_lp_names_group_rows_into_families_by_their_symbol():
    assert lp_name("ship", "Plant A", "Dunmore") == "ship__plant_a__dunmore"
    model = transport()
    assert model.rows_by_family() == {"supply": 2, "demand": 3}
    assert model.variables_by_family() == {"ship": 6}


def test_numbers_in_lp_files_round_trip_exactly():
    for value in (3.0, -12.0, 0.1, 2.675, 1e-7, 123456.789):
        assert float(format_number(value)) == value
    assert format_number(3.0) == "3"


@pytest.mark.parametrize("reader", [solve_lp_text_scip, solve_lp_text_highs], ids=["scip", "highs"])
def test_an_lp_file_re_solves_to_the_models_optimum_with_either_reader(reader):
    for model, optimum in ((transport(), 267.5), (knapsack(), 8.0)):
        assert solve_model(model).objective == pytest.approx(optimum)
        result = reader(write_lp(model))
        assert (result.status, result.objective) == ("optimal", pytest.approx(optimum))


def test_lp_file_wraps_long_expressions_and_still_reads_back():
    b = ModelBuilder("wide")
    names = [b.var(f"x{i}__with_a_rather_long_name_{i}", "integer", 0, 3) for i in range(40)]
    b.row("cap", {name: 1 + i % 4 for i, name in enumerate(names)}, "<=", 50)
    b.maximize({name: 2 + i % 3 for i, name in enumerate(names)})
    model = b.build()
    text = write_lp(model)
    assert max(len(line) for line in text.splitlines()) <= 200
    assert solve_lp_text_highs(text).objective == pytest.approx(solve_model(model).objective)


def test_solution_check_re_evaluates_rows_bounds_and_integrality_itself():
    model = knapsack()
    good = check_solution(model, {"a": 1, "b": 0, "c": 1})
    assert good.feasible and good.objective == 8
    assert any("row weight" in v for v in check_solution(model, {"a": 1, "b": 1, "c": 0}).violations)
    assert any("not integral" in v for v in check_solution(model, {"a": 0.5, "b": 0, "c": 1}).violations)
    assert any("above its upper bound" in v for v in check_solution(model, {"a": 2, "b": 0, "c": 0}).violations)
    assert any("no value" in v for v in check_solution(model, {"a": 1}).violations)


def test_solution_check_polishes_near_integers_before_recomputing_the_objective():
    checked = check_solution(knapsack(), {"a": 0.9999999999, "b": 1e-11, "c": 1.0000000001})
    assert checked.feasible and checked.values == {"a": 1.0, "b": 0.0, "c": 1.0} and checked.objective == 8.0


def test_dual_certificate_proves_the_lp_optimum_and_rejects_a_wrong_claim():
    model = transport()
    certificate = find_dual(model, 267.5)
    assert certificate is not None and certificate.bound == pytest.approx(267.5)
    assert find_dual(model, 260.0) is None  # a claimed optimum below the true one has no proof


def test_dual_bound_rejects_multipliers_with_the_wrong_sign():
    model = transport()
    costs = dict(model.objective)
    assert dual_bound(model, {"demand__x": 4.0}, costs) is not None
    assert dual_bound(model, {"demand__x": -4.0}, costs) is None  # a >= row needs a non-negative multiplier


def test_farkas_certificate_proves_infeasibility_from_the_aggregate_shortage():
    model = transport(supply_a=10.0)  # supply 50 < demand 60
    assert solve_model(model).status == "infeasible"
    certificate = find_farkas(model)
    assert certificate is not None and certificate.kind == "farkas"
    assert certificate.bound == pytest.approx(10.0)  # exactly the shortage
    assert set(certificate.rows) == {"supply__a", "supply__b", "demand__x", "demand__y", "demand__z"}
    assert find_farkas(transport()) is None  # a feasible model has no such proof


def unbounded():
    b = ModelBuilder("u")
    b.var("x", "integer")
    b.var("y")
    b.row("r1", {"x": 1, "y": -2}, ">=", 1)
    b.maximize({"x": 3, "y": 1})
    return b.build()


def test_ray_certificate_is_a_checked_point_plus_an_integral_improving_direction():
    model = unbounded()
    assert solve_model(model).status == "unbounded"
    certificate = find_ray(model)
    assert certificate is not None and check_solution(model, certificate.point).feasible
    assert check_ray(model, certificate.ray)
    assert not check_ray(model, {"x": 0, "y": 1})  # violates r1's recession cone (-2 < 0)
    assert check_ray(model, {"x": 1, "y": 0})  # x alone keeps r1 and improves
    assert not check_ray(model, {"x": -1, "y": 0})  # leaves the lower bound
    assert find_ray(knapsack()) is None


def test_status_of_infeasible_or_unbounded_is_settled_by_a_feasibility_solve():
    # SCIP's presolve proves only "infeasible or unbounded" on this model (y grows with x2 = 0,
    # x0 = 4); the zero-objective re-solve finds a feasible point, so it is unbounded
    b = ModelBuilder("iu")
    b.var("x0")
    b.var("x1")
    b.var("x2", "integer")
    b.row("r0", {"x0": 1, "x2": 2}, ">=", 4)
    b.row("r1", {"x0": -3, "x1": 1, "x2": -3}, ">=", 2)
    b.maximize({"x1": 2, "x2": -1})
    result = solve_model(b.build())
    assert result.status == "unbounded"
    assert result.solver_status.startswith("inforunbd")
