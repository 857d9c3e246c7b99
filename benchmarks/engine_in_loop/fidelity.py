"""Fidelity of a warm (materialized) forward pass against the cold one, on the same positions."""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel


class Fidelity(BaseModel):
    """Warm vs cold over the teacher-forced continuation positions plus greedy decoding after the prompt."""

    max_abs_logit_diff: float
    mean_kl: float
    max_kl: float
    top1_agreement: float
    ppl_cold: float
    ppl_warm: float
    greedy_agreement: float
    greedy_first_divergence: int


def compare(
    cold_logits: torch.Tensor,
    warm_logits: torch.Tensor,
    targets: torch.Tensor,
    cold_greedy: list[int],
    warm_greedy: list[int],
) -> Fidelity:
    """Compare logits ``[n, vocab]`` predicting ``targets`` (``[n]``) and two greedy continuations."""
    cold_lp = torch.log_softmax(cold_logits.float(), dim=-1)
    warm_lp = torch.log_softmax(warm_logits.float(), dim=-1)
    kl = (cold_lp.exp() * (cold_lp - warm_lp)).sum(-1)  # KL(cold || warm) per position
    top1 = (cold_lp.argmax(-1) == warm_lp.argmax(-1)).float().mean()
    nll_cold = -cold_lp.gather(-1, targets.unsqueeze(-1)).mean()
    nll_warm = -warm_lp.gather(-1, targets.unsqueeze(-1)).mean()
    same = [a == b for a, b in zip(cold_greedy, warm_greedy, strict=True)]
    first_div = same.index(False) if False in same else len(same)
    return Fidelity(
        max_abs_logit_diff=float((cold_logits - warm_logits).abs().max()),
        mean_kl=float(kl.mean()),
        max_kl=float(kl.max()),
        top1_agreement=float(top1),
        ppl_cold=math.exp(float(nll_cold)),
        ppl_warm=math.exp(float(nll_warm)),
        greedy_agreement=sum(same) / max(len(same), 1),
        greedy_first_divergence=first_div,
    )
