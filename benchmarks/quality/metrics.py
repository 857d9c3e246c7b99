"""Warm-vs-cold quality measures: next-token KL and top-1 over answer tokens, greedy match, ROUGE-L, perplexity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

KL_LIMIT = 0.05
"""A materialization is acceptable when mean KL(cold || warm) over the answer tokens is at most this ..."""
TASK_SCORE_TOLERANCE = 0.02
"""... and its task score is at least ``(1 - TASK_SCORE_TOLERANCE)`` of cold's."""


def kl_top1(cold_logits: torch.Tensor, warm_logits: torch.Tensor) -> tuple[list[float], float]:
    """Per-position KL(cold || warm) and the top-1 agreement of two ``[n, vocab]`` logit tensors."""
    cold_lp = torch.log_softmax(cold_logits.double(), dim=-1)
    warm_lp = torch.log_softmax(warm_logits.double(), dim=-1)
    kl = (cold_lp.exp() * (cold_lp - warm_lp)).sum(-1).clamp_min(0.0)
    top1 = (cold_lp.argmax(-1) == warm_lp.argmax(-1)).double().mean()
    return [float(x) for x in kl], float(top1)


def perplexity(logits: torch.Tensor, targets: Sequence[int]) -> float:
    """exp(mean NLL) of ``targets`` under ``logits`` ``[len(targets), vocab]``."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    nll = -lp.gather(-1, torch.tensor(list(targets), device=lp.device).unsqueeze(-1)).mean()
    return math.exp(float(nll))


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased alphanumeric words (1.0 for two empty strings)."""
    c, r = words(candidate), words(reference)
    if not c and not r:
        return 1.0
    lcs = _lcs(c, r)
    if lcs == 0:
        return 0.0
    p, q = lcs / len(c), lcs / len(r)
    return 2 * p * q / (p + q)


def acceptable(mean_kl: float, task_warm: float, task_cold: float) -> bool:
    """The quality bar every materialization the gate lets through must meet (see docs/quality.md)."""
    return mean_kl <= KL_LIMIT and task_warm >= (1.0 - TASK_SCORE_TOLERANCE) * task_cold
