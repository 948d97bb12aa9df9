"""Muon for the matrices, AdamW for the rest: the optimizer split Muon is used with in LLM training.

Muon (Jordan et al. 2024; Moonlight, Liu et al. 2025, arXiv 2502.16982) orthogonalises each weight
matrix's momentum with a Newton-Schulz iteration. It is defined for 2-D matrices; embeddings and the
output head stay on AdamW (as in Moonlight), and so do vectors (norms, biases) and the experts' fused
3-D tensors [experts, out, in] of transformers' MoE layers (torch's `Muon` takes 2-D parameters only).
`adjust_lr_fn="match_rms_adamw"` scales Muon's update to AdamW's RMS (Moonlight's rule), so one
`--lr` serves both groups. torch's `torch.optim.Muon` does the arithmetic.

The orthogonalisation needs each matrix whole on the rank that steps it, so Muon runs where the
optimizer sees whole matrices: ZeRO-0 without tensor parallelism (experts sharded by ep stay whole
matrices, and are 3-D anyway). `check_muon_plan` refuses the other plans with the reason.
"""

from __future__ import annotations

import torch

from trex.errors import TrexError

OPTIMIZERS = ("adamw", "muon")


def muon_eligible(name: str, tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and "embed" not in name and "lm_head" not in name


def check_muon_plan(tp: int, zero: int, dp: int) -> None:
    """Refuse plans that split a weight matrix: tp, or ZeRO sharding over more than one replica."""
    if tp > 1 or (zero > 0 and dp > 1):
        raise TrexError(
            f"--optimizer muon orthogonalises whole weight matrices; this plan shards them (tp={tp}, zero={zero}, "
            f"dp={dp}). Use tp=1 and zero=0 (dp and ep are fine) with muon, or --optimizer adamw with this plan"
        )


class MuonWithAdamW:
    """Two torch optimizers stepped together, seen as one (param_groups, state, step, zero_grad)."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], *, lr: float, betas, weight_decay: float, eps: float):
        matrices = [p for name, p in named if muon_eligible(name, p)]
        others = [p for name, p in named if not muon_eligible(name, p)]
        self.parts: list[torch.optim.Optimizer] = []
        if matrices:
            self.parts.append(
                torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
            )
        if others:
            self.parts.append(
                torch.optim.AdamW(others, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, foreach=False)
            )
        self.muon_parameters = {id(p) for p in matrices}

    @property
    def param_groups(self) -> list[dict]:
        return [group for part in self.parts for group in part.param_groups]

    @property
    def state(self) -> dict:
        """Read-only merge of the parts' states (a parameter lives in one part)."""
        merged: dict = {}
        for part in self.parts:
            merged.update(part.state)
        return merged

    def is_muon(self, tensor: torch.Tensor) -> bool:
        return id(tensor) in self.muon_parameters

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)
