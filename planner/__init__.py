"""trex.planner: the parallel planner (a configuration search over the cost model's ModelSpec, not a graph pass).

Finds the fastest way to lay a model out over a cluster - data, tensor (with sequence), pipeline
(with virtual stages), expert, expert-tensor and context parallelism, the ZeRO stage, micro-batch,
recompute policy and the stage split - priced by the cost model (`trex.cost_model`).

    from trex.planner import plan_parallel
    result = plan_parallel("deepseek-v4-pro", "cloudmatrix384", 1024, seq=4096, gbs=1024)
    print(result.best)                           # a trex.plan.Plan

Modules, one concept each:
    space        the search space: which degrees, batch splits and recompute policies are enumerated
    topology     where tensor- and expert-parallel groups land on the cluster's tiers
    pricing      layer kinds priced once per layer-level choice; chunk times and memory for the splitter
    stage_split  pipeline stage partitioning: optimal, or optimal within a proved gap
    search       branch and bound over plans, priced by estimate_step
    baselines    named public recipes (data/baseline_recipes.toml) turned into plans for a run
    reasons      why a plan loses to another
    planning     search + baseline -> Plans (what `trex plan` prints)
"""

from trex.planner.baselines import Recipe, baseline_plan, default_recipe, get_recipe, recipe_names
from trex.planner.planning import Baseline, PlanningResult, RunnerUp, plan_parallel
from trex.planner.search import Candidate, SearchResult, SearchStats, search
from trex.planner.space import SearchSpace
from trex.planner.stage_split import SplitProblem, StageSplit, split_stages

__all__ = [
    "Baseline",
    "Candidate",
    "PlanningResult",
    "Recipe",
    "RunnerUp",
    "SearchResult",
    "SearchSpace",
    "SearchStats",
    "SplitProblem",
    "StageSplit",
    "baseline_plan",
    "default_recipe",
    "get_recipe",
    "plan_parallel",
    "recipe_names",
    "search",
    "split_stages",
]
