"""torch_npu's operator schemas, as shipped in its wheel, and the check of every call trex emits.

torch_npu declares its operators in `torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`
(one `func: name(args) -> returns` line per operator, TorchScript schema syntax). Importing torch_npu
needs the Ascend runtime, but reading that file does not, so the schemas are taken from the wheel
itself: `trex.backends.ascend.extract_schemas` copies the lines of the operators this backend emits
into `data/torch_npu_schemas.txt` (with the wheel's name and digest), and the tests re-read the wheel
when one is at hand. Every call the lowering emits is bound against its schema here; a mismatch
(unknown operator or argument, a missing required argument, a keyword-only argument passed by
position, a value of the wrong type) raises `AscendSchemaError` naming the operator and the argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import fx

from trex.errors import BackendError

DATA_FILE = Path(__file__).parent / "data" / "torch_npu_schemas.txt"
YAML_IN_WHEEL = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
TORCH_NPU_VERSION = "2.13.0"

# The operators this backend emits (forward and backward regions) and the backward operators its
# emulations' autograd calls; torch_npu's names.
EMITTED_OPS: tuple[str, ...] = (
    "npu_rms_norm",
    "npu_rms_norm_backward",
    "npu_swiglu",
    "npu_swiglu_backward",
    "npu_clipped_swiglu",
    "npu_rotary_mul",
    "npu_rotary_mul_backward",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing_v2",
    "npu_moe_token_permute",
    "npu_moe_token_permute_grad_v2",
    "npu_moe_token_unpermute",
    "npu_moe_token_unpermute_grad",
    "npu_moe_compute_expert_tokens",
    "npu_grouped_matmul",
    "npu_grouped_matmul_add",
    "npu_grouped_matmul_add_",
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_moe_gating_top_k",
    "npu_moe_gating_top_k_backward",
)

_FUNC_LINE = re.compile(r"^\s*(?:-\s*)?func:\s*(?P<schema>\S.*?)\s*$")


class AscendSchemaError(BackendError):
    """An emitted call does not match torch_npu's schema of the operator (names the op and argument)."""


def schema_lines(yaml_text: str) -> dict[str, str]:
    """Operator name (with `.overload`) -> its schema text, for every `func:` line of the yaml."""
    found: dict[str, str] = {}
    for line in yaml_text.splitlines():
        match = _FUNC_LINE.match(line)
        if match is None:
            continue
        schema = match.group("schema")
        name = schema.split("(", 1)[0]
        if "(" not in schema:  # e.g. `func: clone` (an aten op listed by name only)
            continue
        if name in found and found[name] != schema:
            raise AscendSchemaError(
                f"torch_npu's yaml declares {name} twice with different schemas:\n  {found[name]}\n  {schema}"
            )
        found.setdefault(name, schema)
    return found


def read_data_file(path: Path = DATA_FILE) -> tuple[dict[str, str], dict[str, str]]:
    """(header fields, op name -> schema) of the checked-in schema file."""
    header: dict[str, str] = {}
    schemas: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            if value:
                header[key.strip()] = value.strip()
            continue
        if line.strip():
            schemas[line.split("(", 1)[0]] = line.strip()
    return header, schemas


@cache
def shipped_schemas() -> dict[str, torch._C.FunctionSchema]:
    """The parsed schemas of the emitted ops, from the data file extracted from torch_npu's wheel."""
    if not DATA_FILE.is_file():
        raise AscendSchemaError(
            f"{DATA_FILE} is missing; regenerate it with `python -m trex.backends.ascend.extract_schemas WHEEL`"
        )
    _, texts = read_data_file()
    missing = [op for op in EMITTED_OPS if op not in texts]
    if missing:
        raise AscendSchemaError(
            f"{DATA_FILE.name} lacks the schema of {', '.join(missing)}; regenerate it with extract_schemas"
        )
    return {name: torch._C.parse_schema(text) for name, text in texts.items()}


def schema_of(op: str) -> torch._C.FunctionSchema:
    schemas = shipped_schemas()
    if op not in schemas:
        raise AscendSchemaError(
            f"{op} is not an operator of torch_npu {TORCH_NPU_VERSION} (known here: {', '.join(sorted(schemas))})"
        )
    return schemas[op]


# ---------------------------------------------------------------------------------------------
# Value checks: what a schema type accepts. Values are fx.Nodes (their meta["val"]) or constants.


def _value_of(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, fx.Node) else value


def _type_problem(type_: Any, value: Any) -> str | None:
    """None when `value` fits `type_`, else what is wrong."""
    kind = type_.kind()
    if kind == "OptionalType":
        return None if value is None else _type_problem(type_.getElementType(), value)
    if isinstance(value, fx.Node) and kind == "ListType" and isinstance(_value_of(value), (list, tuple)):
        value = list(_value_of(value))
    if kind == "ListType":
        if not isinstance(value, (list, tuple)):
            return f"expected a list ({type_}), got {type(_value_of(value)).__name__}"
        for i, item in enumerate(value):
            problem = _type_problem(type_.getElementType(), item)
            if problem:
                return f"item {i}: {problem}"
        return None
    concrete = _value_of(value)
    if kind == "TensorType":
        return None if isinstance(concrete, torch.Tensor) else f"expected a Tensor, got {type(concrete).__name__}"
    if isinstance(concrete, torch.Tensor):
        return f"expected {type_}, got a Tensor"
    if kind in ("IntType", "SymIntType"):
        ok = isinstance(concrete, (int, torch.SymInt)) and not isinstance(concrete, bool)
        return None if ok else f"expected int, got {type(concrete).__name__} {concrete!r}"
    if kind in ("FloatType",):
        ok = isinstance(concrete, (int, float, torch.SymFloat)) and not isinstance(concrete, bool)
        return None if ok else f"expected float, got {type(concrete).__name__} {concrete!r}"
    if kind == "BoolType":
        return None if isinstance(concrete, bool) else f"expected bool, got {type(concrete).__name__} {concrete!r}"
    if kind == "StringType":
        return None if isinstance(concrete, str) else f"expected str, got {type(concrete).__name__} {concrete!r}"
    if kind == "ScalarTypeType" or str(type_) == "ScalarType":
        return (
            None
            if isinstance(concrete, torch.dtype)
            else f"expected a dtype (ScalarType), got {type(concrete).__name__}"
        )
    return None if concrete is not None else f"expected {type_}, got None"


@dataclass(frozen=True)
class BoundCall:
    """A validated call: the op's name and every argument by schema name (defaults filled in)."""

    op: str
    arguments: Mapping[str, Any]


def check_call(
    op: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    allowed: Mapping[str, Sequence[Any]] | None = None,
) -> BoundCall:
    """Bind a call to torch_npu's schema of `op`, or raise `AscendSchemaError` naming op and argument.

    `allowed` restricts argument values further (values the op's documentation says it supports,
    e.g. `padded_mode` must be False).
    """
    schema = schema_of(op)
    kwargs = dict(kwargs or {})
    arguments = list(schema.arguments)
    if len(args) > len(arguments):
        raise AscendSchemaError(f"{op}: {len(args)} positional arguments, the schema has {len(arguments)}: {schema}")
    bound: dict[str, Any] = {}
    for argument, value in zip(arguments, args):
        if argument.kwarg_only:
            raise AscendSchemaError(
                f"{op}: argument {argument.name!r} is keyword-only in torch_npu's schema but was passed by position"
            )
        bound[argument.name] = value
    names = {a.name for a in arguments}
    for name, value in kwargs.items():
        if name not in names:
            raise AscendSchemaError(
                f"{op}: no argument named {name!r} in torch_npu's schema ({', '.join(a.name for a in arguments)})"
            )
        if name in bound:
            raise AscendSchemaError(f"{op}: argument {name!r} given by position and by keyword")
        bound[name] = value
    for argument in arguments:
        if argument.name not in bound:
            if not argument.has_default_value():
                raise AscendSchemaError(f"{op}: required argument {argument.name!r} ({argument.real_type}) is missing")
            bound[argument.name] = argument.default_value
            continue
        declared = getattr(argument, "real_type", argument.type)  # ScalarType, SymInt: `type` says int
        problem = _type_problem(declared, bound[argument.name])
        if problem:
            raise AscendSchemaError(f"{op}: argument {argument.name!r} ({declared}): {problem}")
    for name, values in (allowed or {}).items():
        if bound.get(name) not in values:
            raise AscendSchemaError(
                f"{op}: argument {name!r}={bound.get(name)!r}; torch_npu supports only {list(values)} here"
            )
    return BoundCall(op, bound)
