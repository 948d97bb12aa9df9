"""What one changed routing decision costs: eager runs of tiny DeepSeek-V3 with a token's experts forced.

    python bench/numerics/forced_routing.py ROUTER:TOKEN:E1,E2 [ROUTER:TOKEN:E1,E2 ...]

Why: `bf16_gradients_vs_fp32.py diff` shows which routing decisions a compiled program takes differently from
eager (e.g. `router 1, token 20: [2, 3] -> [6, 7]`). To tell whether such a flip, and not a precision loss
elsewhere, explains a loss or gradient gap, this script runs eager bf16 and the same weights in fp32 on the test's
batch (seed 1 weights, generator seed 0 tokens), once as they are and once with each given router (0 = the first
MoE layer's) sending the given token (row of the flattened batch) to the given experts, with the weights the
router's own rule gives them (sigmoid scores of those experts, normalised, scaled). It prints the loss distance to
the unforced fp32 run and, for the forced bf16 run, each gradient's distance to fp32 over eager bf16's (the
ratio `step_matches_eager(fp32_reference=True)` bounds by 2), to compare with the compiled program's.
"""

from __future__ import annotations

import argparse
import copy

import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3

from trex.models import build_model, tiny_config

Router = modeling_deepseek_v3.DeepseekV3TopkRouter


def parse(spec: str) -> tuple[int, int, list[int]]:
    try:
        router, token, experts = spec.split(":")
        return int(router), int(token), [int(e) for e in experts.split(",")]
    except ValueError:
        raise SystemExit(f"bad choice {spec!r}: write ROUTER:TOKEN:E1,E2, e.g. 1:20:6,7") from None


def forced_forward(choices: dict[int, tuple[int, list[int]]]):
    """`DeepseekV3TopkRouter.forward` with the experts of the chosen (router, token) pairs replaced."""
    original = Router.forward

    def forward(self, hidden_states):
        logits, weights, indices = original(self, hidden_states)
        if self.trex_index not in choices:
            return logits, weights, indices
        token, experts = choices[self.trex_index]
        indices = indices.clone()
        indices[token] = torch.tensor(experts, dtype=indices.dtype)
        chosen = logits.sigmoid().gather(1, indices)
        if self.norm_topk_prob:
            chosen = chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
        weights = weights.clone()
        weights[token] = (chosen * self.routed_scaling_factor)[token].to(weights.dtype)
        return logits, weights, indices

    return forward


def step(model, input_ids, choices) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    for index, router in enumerate(m for m in model.modules() if isinstance(m, Router)):
        router.trex_index = index
    original = Router.forward
    Router.forward = forced_forward(choices)
    try:
        loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
    finally:
        Router.forward = original
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float(), grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("choices", nargs="+", metavar="ROUTER:TOKEN:E1,E2")
    parser.add_argument("--top", type=int, default=6, help="gradients listed")
    args = parser.parse_args()
    choices = {router: (token, experts) for router, token, experts in map(parse, args.choices)}
    config = tiny_config("deepseek-v3")
    base = build_model(config, dtype=torch.bfloat16, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    exact_loss, exact = step(copy.deepcopy(base).float(), input_ids, {})
    eager_loss, eager = step(copy.deepcopy(base), input_ids, {})
    forced_loss, forced = step(copy.deepcopy(base), input_ids, choices)
    forced32_loss, _ = step(copy.deepcopy(base).float(), input_ids, choices)
    print(
        f"loss distance to fp32: eager bf16 {(eager_loss - exact_loss).abs().item():.3g}, forced bf16 "
        f"{(forced_loss - exact_loss).abs().item():.3g}, forced fp32 {(forced32_loss - exact_loss).abs().item():.3g}"
    )
    rows = []
    for name, reference in exact.items():
        rounding = torch.linalg.vector_norm(reference.bfloat16().float() - reference).item()
        mine = torch.linalg.vector_norm(forced[name] - reference).item()
        theirs = torch.linalg.vector_norm(eager[name] - reference).item()
        rows.append((mine / max(theirs, rounding, 1e-30), name))
    rows.sort(reverse=True)
    print(f"forced bf16 gradients over 2x eager's distance: {sum(r > 2 for r, _ in rows)} of {len(rows)}")
    for ratio, name in rows[: args.top]:
        print(f"   {name:55s} {ratio:5.2f}x")


if __name__ == "__main__":
    main()
