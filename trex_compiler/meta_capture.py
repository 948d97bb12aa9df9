"""Full-size capture for planning: every distinct decoder-layer kind of a model, on the meta device.

Planning a 284B or 1.6T-parameter model needs its graphs, not its weights. The model is built on
the meta device (nothing allocated), run once on meta inputs to record what each decoder layer
receives, and its decoder layers are clustered into kinds (same attention type, same MLP type, same
parameter shapes). One representative layer per kind is captured through the same path as
`trex.compile` (Dynamo + AOTAutograd joint graph + the pass pipeline), so a planner prices each
kind once and multiplies by its count. The embedding, final norm, LM head and loss are captured as
one more graph ("ends": the model with no decoder layers), which sits on the first and last stage.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from trex.capture import CapturedGraph
from trex.driver import CompileOptions, TrexCompiler
from trex.errors import CaptureError, TrexError


@dataclass
class LayerKind:
    """Decoder layers that share one graph: same attention and MLP type, same parameter shapes."""

    name: str
    layer_indices: list[int]
    params_per_layer: int
    active_params_per_layer: int
    graph: CapturedGraph | None = None
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return len(self.layer_indices)

    def node_counts(self) -> dict[str, int]:
        if self.graph is None:
            return {}
        counts = {"dynamo": len(self.graph.dynamo_graph.graph.nodes)}
        for label, module in (
            ("joint", self.graph.joint),
            ("forward", self.graph.forward),
            ("backward", self.graph.backward),
        ):
            if module is not None:
                counts[label] = len(module.graph.nodes)
        return counts


@dataclass
class ModelCapture:
    model: str
    batch: int
    seq: int
    dtype: torch.dtype
    total_params: int
    active_params: int
    kinds: list[LayerKind] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return sum(k.count for k in self.kinds if k.name != ENDS)


ENDS = "ends (embedding, final norm, LM head, loss)"


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder stack: the longest ModuleList whose members share one class."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        uniform = isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1
        if uniform and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        raise CaptureError(
            f"{type(model).__name__} has no decoder stack (an nn.ModuleList of identical layer classes) to cluster"
        )
    return best


def _per_layer_type(config: Any, attribute: str, index: int) -> str | None:
    values = getattr(config, attribute, None)
    if isinstance(values, (list, tuple)) and index < len(values):
        return str(values[index])
    return None


def _kind_name(config: Any, layer: nn.Module, index: int) -> str:
    attention = _per_layer_type(config, "layer_types", index)
    mlp = _per_layer_type(config, "mlp_layer_types", index)
    mlp_module = getattr(layer, "mlp", None)
    parts = []
    if attention:
        parts.append(f"attention={attention}")
    parts.append(f"mlp={mlp or type(mlp_module).__name__ if mlp_module is not None else 'none'}")
    return ", ".join(parts)


def _signature(layer: nn.Module) -> tuple:
    return tuple((n, tuple(t.shape), t.dtype) for n, t in (*layer.named_parameters(), *layer.named_buffers()))


def routed_expert_params(module: nn.Module) -> tuple[int, int]:
    """(all routed-expert parameters, those a token activates) inside `module`."""
    from trex.integrations.transformers_moe import experts_modules

    total = active = 0
    for _, experts in experts_modules(module):
        count = experts.gate_up_proj.numel() + experts.down_proj.numel()
        num_experts = experts.gate_up_proj.shape[0]
        top_k = getattr(experts.config, "num_experts_per_tok", num_experts)
        total += count
        active += count * top_k // num_experts
    return total, active


def parameter_counts(module: nn.Module) -> tuple[int, int]:
    """(total, active per token) parameters; active counts top_k of E routed experts."""
    total = sum(p.numel() for p in module.parameters())
    routed, routed_active = routed_expert_params(module)
    return total, total - routed + routed_active


def _record_inputs(layers: nn.ModuleList, wanted: set[int]) -> tuple[dict[int, tuple[tuple, dict]], list]:
    recorded: dict[int, tuple[tuple, dict]] = {}
    handles = []
    for index in wanted:

        def hook(module, args, kwargs, index=index):
            recorded[index] = (args, dict(kwargs))

        handles.append(layers[index].register_forward_pre_hook(hook, with_kwargs=True))
    return recorded, handles


def _requiring_grad(value: Any) -> Any:
    """Activations entering a layer carry gradients in training (so the joint graph has dX)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().requires_grad_(True)
    return value


def _capture_module(module: nn.Module, args: tuple, kwargs: dict, options: CompileOptions) -> CapturedGraph:
    compiler = TrexCompiler(options)
    # static shapes: a planner prices the shapes it asked for, whatever was captured before
    compiled = torch.compile(module, backend=compiler, fullgraph=True, dynamic=False)
    try:
        compiled(*args, **kwargs)
    except TrexError:
        raise
    except Exception as error:
        raise CaptureError(
            f"meta capture of {type(module).__name__} failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    if len(compiler.graphs) != 1:
        raise CaptureError(
            f"meta capture of {type(module).__name__} produced {len(compiler.graphs)} graphs; expected one"
        )
    return compiler.graphs[0]


def capture_model(
    name_or_config: str | Path | Any,
    *,
    batch: int = 1,
    seq: int = 4096,
    dtype: torch.dtype = torch.bfloat16,
    passes: Any = None,
    dump_dir: str | Path | None = None,
    include_ends: bool = True,
    backend: Any = None,
) -> ModelCapture:
    """Capture every distinct layer kind of a full-size model on the meta device (see module doc).

    `backend` (as `trex.compile`'s) lowers the captured graphs, e.g. ["ascend"] to price what its
    fused ops cover at full size; None keeps the default."""
    from trex.integrations.transformers_moe import use_trex_experts
    from trex.models import build_model, load_config

    started = time.perf_counter()
    config = load_config(name_or_config) if isinstance(name_or_config, (str, Path)) else name_or_config
    label = str(name_or_config) if isinstance(name_or_config, (str, Path)) else type(config).__name__
    config._attn_implementation = (
        "eager" if getattr(config, "_attn_implementation", None) is None else config._attn_implementation
    )
    model = build_model(config, dtype=dtype, device="meta")
    use_trex_experts(model)
    model.train()
    stack_name, layers = decoder_layers(model)
    seconds = {"build": time.perf_counter() - started}

    groups: OrderedDict[tuple, list[int]] = OrderedDict()
    names: dict[tuple, str] = {}
    for index, layer in enumerate(layers):
        key = (_kind_name(config, layer, index), _signature(layer))
        groups.setdefault(key, []).append(index)
        names[key] = key[0]
    # Two kinds with the same readable name (e.g. different shapes) get numbered.
    seen: dict[str, int] = {}
    kinds = []
    for key, indices in groups.items():
        base = names[key]
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base} #{seen[base]}"
        total, active = parameter_counts(layers[indices[0]])
        kinds.append(LayerKind(name, indices, total, active))

    total, active = parameter_counts(model)
    capture = ModelCapture(label, batch, seq, dtype, total, active, seconds=seconds)

    start = time.perf_counter()
    recorded, handles = _record_inputs(layers, {k.layer_indices[0] for k in kinds})
    input_ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False)
    except Exception as error:
        raise CaptureError(
            f"running {label} on the meta device failed before capture ({type(error).__name__}: {error}); the model does something data-dependent outside its layers"
        ) from error
    finally:
        for handle in handles:
            handle.remove()
    capture.seconds["meta_run"] = time.perf_counter() - start

    cache_limit = max(8, 2 * len(kinds) + 2)
    with torch._dynamo.config.patch(cache_size_limit=cache_limit, accumulated_cache_size_limit=max(256, cache_limit)):
        for number, kind in enumerate(kinds):
            start = time.perf_counter()
            args, kwargs = recorded[kind.layer_indices[0]]
            args = tuple(_requiring_grad(a) for a in args)
            kwargs = {k: _requiring_grad(v) if k == "hidden_states" else v for k, v in kwargs.items()}
            options = CompileOptions.build(
                passes=passes, backend=backend, dump_dir=Path(dump_dir) / f"kind_{number}" if dump_dir else None
            )
            kind.graph = _capture_module(layers[kind.layer_indices[0]], args, kwargs, options)
            kind.seconds = time.perf_counter() - start
            capture.kinds.append(kind)
        if include_ends:
            start = time.perf_counter()
            ends = _capture_ends(model, stack_name, input_ids, passes, Path(dump_dir) / "ends" if dump_dir else None)
            ends_params = total - sum(k.params_per_layer * k.count for k in kinds)  # all active: no experts
            capture.kinds.append(LayerKind(ENDS, [], ends_params, ends_params, ends, time.perf_counter() - start))
    capture.seconds["capture"] = sum(k.seconds for k in capture.kinds)
    capture.seconds["total"] = time.perf_counter() - started
    return capture


def _capture_ends(
    model: nn.Module, stack_name: str, input_ids: torch.Tensor, passes: Any, dump_dir: Path | None
) -> CapturedGraph:
    """The model with its decoder stack emptied: embedding -> final norm -> LM head -> loss."""
    parent_name, _, attribute = stack_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    layers = getattr(parent, attribute)
    setattr(parent, attribute, nn.ModuleList())
    try:
        options = CompileOptions.build(passes=passes, dump_dir=dump_dir)
        with warnings.catch_warnings():
            # AOTAutograd traces nll_loss's backward on meta tensors through the fallback kernel
            warnings.filterwarnings("ignore", message="aten::nll_loss: an autograd kernel was not registered")
            return _capture_module(
                model,
                (),
                {
                    "input_ids": input_ids,
                    "attention_mask": torch.ones_like(input_ids),
                    "labels": input_ids,
                    "use_cache": False,
                },
                options,
            )
    finally:
        setattr(parent, attribute, layers)


def joint_graphs(capture: ModelCapture) -> list[tuple[LayerKind, fx.GraphModule]]:
    """(kind, joint graph after the pipeline) for every captured kind: what a planner prices."""
    return [(k, k.graph.joint) for k in capture.kinds if k.graph is not None and k.graph.joint is not None]
