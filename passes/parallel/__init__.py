"""trex.passes.parallel: the parallel planner.

Finds the fastest way to lay a model out over a cluster - data, tensor (with sequence), pipeline
(with virtual stages), expert, expert-tensor and context parallelism, the ZeRO stage, micro-batch,
recompute policy and the stage split - priced by the cost model (`trex.cost_model`).

    from trex.passes.parallel import plan_parallel
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
    planner      search + baseline -> Plans (what `trex plan` prints)
"""

from trex.passes.parallel.baselines import Recipe, baseline_plan, default_recipe, get_recipe, recipe_names
from trex.passes.parallel.planner import Baseline, PlanningResult, RunnerUp, plan_parallel
from trex.passes.parallel.search import Candidate, SearchResult, SearchStats, search
from trex.passes.parallel.space import SearchSpace
from trex.passes.parallel.stage_split import SplitProblem, StageSplit, split_stages

__all__ = [
    "Baseline", "Candidate", "PlanningResult", "Recipe", "RunnerUp", "SearchResult", "SearchSpace", "SearchStats", "SplitProblem", "StageSplit",
    "baseline_plan", "default_recipe", "get_recipe", "plan_parallel", "recipe_names", "search", "split_stages",
]
