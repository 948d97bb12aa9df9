"""Named public parallel layouts ("recipes") the planner's result is compared with.

Recipes live in `data/baseline_recipes.toml`, each with its source. `baseline_plan` turns one into a
`ParallelConfig` for the run being planned: the recipe's model-parallel layout (tp, pp, vpp, cp, ep,
etp, pipeline layout, ZeRO stage, micro-batch, recompute) with the run's device count, sequence,
global batch and software settings (dp = devices / (tp * pp * cp)). What had to change to fit the
model (the stand-in recipe for models without a public layout) is reported, never hidden.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from trex.cost_model.model_spec import ModelSpec
from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError, UnknownNameError

STAND_IN = "stand-in-megatron-dsv3"
_LAYOUT_FIELDS = ("tp", "pp", "vpp", "ep", "etp", "cp", "zero", "mbs")
_PRECISIONS = ("bf16", "fp16", "fp8", "fp32")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    source: str
    models: tuple[str, ...]
    values: dict[str, Any]  # layout fields; a table maps model name -> value
    pipeline_layout: str | None
    recompute: str
    not_modelled: tuple[str, ...]
    published_row: str | dict[str, str] | None = (
        None  # the row(s) of published_runs.csv or published_runs_extra.csv this layout ran as
    )
    precision: str | None = (
        None  # the precision the recipe is written for (None: any); preferred when planning that precision
    )

    def value(self, field: str, model: str) -> Any:
        v = self.values[field]
        if isinstance(v, dict):
            if model not in v:
                raise TrexError(f"recipe {self.name!r} gives {field} for {', '.join(sorted(v))}, not for {model!r}")
            return v[model]
        return v


@cache
def recipes() -> dict[str, Recipe]:
    data = tomllib.loads(resources.files("trex.planner").joinpath("data", "baseline_recipes.toml").read_text())
    out = {}
    for name, entry in data.items():
        missing = [f for f in (*_LAYOUT_FIELDS, "recompute", "source", "description", "models") if f not in entry]
        if missing:
            raise TrexError(f"baseline_recipes.toml [{name}]: missing {', '.join(missing)}")
        precision = entry.get("precision")
        if precision is not None and precision not in _PRECISIONS:
            raise TrexError(
                f"baseline_recipes.toml [{name}]: precision {precision!r} is not one of {', '.join(_PRECISIONS)}"
            )
        out[name] = Recipe(
            name,
            entry["description"],
            entry["source"],
            tuple(entry["models"]),
            {f: entry[f] for f in _LAYOUT_FIELDS},
            entry.get("pipeline_layout"),
            entry["recompute"],
            tuple(entry.get("not_modelled", ())),
            entry.get("published_row"),
            precision,
        )
    return out


# Fields of a published setup that are the layout (the recipe's own) or the run's shape, not software.
_NOT_SOFTWARE = frozenset({*_LAYOUT_FIELDS, "dp", "gbs", "seq", "precision", "recompute", "layers_per_chunk", "source"})


def published_software(recipe: Recipe, model: str) -> dict[str, Any]:
    """The software settings the recipe's published run used (dispatcher, overlaps, attention kernel,
    gradient dtypes...), read from `trex.cost_model`'s published_setups.toml for its `published_row`."""
    from dataclasses import fields

    from trex.cost_model.parallel import ParallelConfig
    from trex.cost_model.validation import published_setups

    row = recipe.published_row.get(model) if isinstance(recipe.published_row, dict) else recipe.published_row
    if row is None:
        return {}
    setups = published_setups()
    if row not in setups:
        raise TrexError(f"recipe {recipe.name!r}: published_row {row!r} has no entry in published_setups.toml")
    known = {f.name for f in fields(ParallelConfig)}
    return {key: value for key, value in setups[row].items() if key in known and key not in _NOT_SOFTWARE}


def software_differences(recipe: Recipe, model: str, config: ParallelConfig) -> list[str]:
    """Where the baseline is priced with other software than its published run used. A baseline takes the
    search's software so that both sides are priced alike; this says so, with the setting that prices both
    as the published run ran."""
    out = []
    for key, value in published_software(recipe, model).items():
        if key == "fp8_recipe" and config.precision != "fp8":
            continue  # how FP8 is scaled does not matter to a plan that does not run FP8
        priced = getattr(config, key)
        if priced != value:
            shown = str(value).lower() if isinstance(value, bool) else value
            out.append(
                f"the published run used {key}={shown}; priced here with the search's {key}={str(priced).lower() if isinstance(priced, bool) else priced} "
                f"(--set {key}={shown} prices both that way)"
            )
    return out


def recipe_names() -> list[str]:
    return sorted(recipes())


def recipes_for(spec: ModelSpec, precision: str | None = None) -> list[Recipe]:
    """The public recipes written for this model (file order; those written for `precision` first), or the
    documented stand-in when there is none."""
    own = [recipe for recipe in recipes().values() if spec.name in recipe.models]
    if precision is not None:
        # written for this precision, then for any, then for another; file order within each (the sort is stable)
        own.sort(key=lambda recipe: 0 if recipe.precision == precision else 1 if recipe.precision is None else 2)
    return own or [recipes()[STAND_IN]]


def default_recipe(spec: ModelSpec) -> Recipe:
    return recipes_for(spec)[0]


def get_recipe(name: str) -> Recipe:
    if name not in recipes():
        raise UnknownNameError("baseline recipe", name, recipes())
    return recipes()[name]


def layers_per_chunk_from_layout(layout: str, chunks: int, num_layers: int) -> tuple[int, ...]:
    """Decoder layers per chunk of a Megatron pipeline layout such as "Et*4|(tttt|)*14tmL".

    Single-symbol repeats ("t*4") are expanded here; the rest is `trex.cost_model.validation`'s parser.
    """
    from trex.cost_model.validation import layers_per_chunk_from_layout as parse

    return parse(
        re.sub(r"([A-Za-z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout.replace(" ", "")),
        chunks,
        num_layers,
    )


def _largest_divisor(n: int, at_most: int, divides: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0 and divides % d == 0)


def baseline_plan(
    recipe: Recipe, spec: ModelSpec, devices: int, template: ParallelConfig
) -> tuple[ParallelConfig, list[str]]:
    """The recipe's layout for this run, and what had to be adapted (empty for the recipe's own models)."""
    model = spec.name if spec.name in recipe.models else None
    key = model or ""
    values = (
        {f: recipe.value(f, key) if isinstance(recipe.values[f], dict) else recipe.values[f] for f in _LAYOUT_FIELDS}
        if model
        else {f: recipe.values[f] for f in _LAYOUT_FIELDS if not isinstance(recipe.values[f], dict)}
    )
    adjusted: list[str] = []
    if model is None:
        values = _fit_stand_in(values, spec, devices, adjusted)
    per_replica = values["tp"] * values["pp"] * values["cp"]
    if devices % per_replica:
        raise TrexError(f"recipe {recipe.name!r} needs tp*pp*cp = {per_replica} to divide the {devices} devices")
    layers_per_chunk = None
    if recipe.pipeline_layout and model is not None:
        layers_per_chunk = layers_per_chunk_from_layout(
            recipe.pipeline_layout, values["pp"] * values["vpp"], spec.num_layers
        )
    plan = dataclasses.replace(
        template, **values, dp=devices // per_replica, recompute=recipe.recompute, layers_per_chunk=layers_per_chunk
    )
    return plan, adjusted


def _fit_stand_in(values: dict[str, Any], spec: ModelSpec, devices: int, adjusted: list[str]) -> dict[str, Any]:
    """Scale the stand-in layout to a model it was not written for, saying what changed."""
    from trex.planner.space import model_facts

    heads, experts, _ = model_facts(spec)
    out = dict(values)
    if heads % out["tp"] or devices % out["tp"]:
        out["tp"] = _largest_divisor(heads, out["tp"], devices)
        adjusted.append(f"tp {values['tp']} -> {out['tp']} (heads {heads}, devices {devices})")
    layers = spec.num_layers
    while out["pp"] > 1 and (devices % (out["tp"] * out["pp"] * out["cp"]) or out["pp"] > layers):
        out["pp"] //= 2
    if out["pp"] != values["pp"]:
        adjusted.append(f"pp {values['pp']} -> {out['pp']} ({layers} layers, {devices} devices)")
    if out["pp"] == 1 or out["pp"] * out["vpp"] > layers:
        out["vpp"] = 1 if out["pp"] == 1 else max(1, layers // out["pp"])
        adjusted.append(f"vpp {values['vpp']} -> {out['vpp']}")
    stage = devices // out["pp"]
    if experts is None:
        if out["ep"] != 1:
            adjusted.append(f"ep {out['ep']} -> 1 (dense model)")
        out["ep"] = 1
    else:
        ep = _largest_divisor(experts, out["ep"], stage)
        if ep != out["ep"]:
            adjusted.append(f"ep {out['ep']} -> {ep} ({experts} experts, {stage} ranks per stage)")
        out["ep"] = ep
    return out
