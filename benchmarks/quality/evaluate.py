"""One manifest item through cold and every mode; one row of measures per (item, mode)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.quality.metrics import acceptable, kl_top1, perplexity, rouge_l
from benchmarks.quality.modes import Mode, WarmRun, gate
from benchmarks.quality.workload import chat_tokens
from semblend_apps.reference_engine.hf_model import cache_layers
from semblend_apps.reference_engine.prefill_runner import PrefillRunner

ANSWER_TOKENS = 32


@dataclass
class Side:
    """What one prefill (cold or warm) says about the answer."""

    greedy: list[int]
    """Greedy tokens after the prompt, cut after the end-of-turn token."""
    text: str


class Continuer:
    """Decodes after a prompt's K/V without touching it: the K/V is copied into a scratch arena with room to grow.

    (Decoding on a ``DynamicCache`` re-concatenates every layer's K/V per token, the dominant cost on CPU.)
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.runner = PrefillRunner(model)

    def _load(self, cache: Any, n: int, extra: int) -> None:
        arena = self.runner.reserve(n + extra)
        for i, (k, v) in enumerate(cache_layers(cache)):
            arena.kv[i, 0, :, :n].copy_(k[0, :, :n])
            arena.kv[i, 1, :, :n].copy_(v[0, :, :n])

    def greedy(self, cache: Any, prompt: Sequence[int], last: torch.Tensor, steps: int, stop: int) -> list[int]:
        self._load(cache, len(prompt), steps)
        out: list[int] = []
        logits = last[-1]
        for _ in range(steps):
            out.append(int(torch.argmax(logits)))
            if out[-1] == stop or len(out) == steps:
                break
            seq = [*prompt, *out]
            logits = self.runner.prefill(seq, len(seq) - 1, 1)[-1]
        return out

    def forced(self, cache: Any, prompt: Sequence[int], last: torch.Tensor, targets: Sequence[int]) -> torch.Tensor:
        """Logits predicting each of ``targets`` after the prompt (teacher forced), ``[len(targets), vocab]``."""
        if len(targets) == 1:
            return last[-1:].float()
        self._load(cache, len(prompt), len(targets))
        rest = self.runner.prefill([*prompt, *targets[:-1]], len(prompt), len(targets) - 1)
        return torch.cat([last[-1:].float(), rest.float()])


class ItemEvaluator:
    """Runs items of a manifest through cold and the given modes (see :meth:`rows`)."""

    def __init__(self, model: Any, tokenizer: Any, modes: dict[str, Mode], *, answer_tokens: int = ANSWER_TOKENS):
        self.model = model
        self.tokenizer = tokenizer
        self.modes = modes
        self.answer_tokens = answer_tokens
        self.stop = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.cont = Continuer(model)

    def _side(self, cache: Any, prompt: Sequence[int], last: torch.Tensor) -> Side:
        tokens = self.cont.greedy(cache, prompt, last, self.answer_tokens, self.stop)
        return Side(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True).strip())

    def rows(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """One row per mode: what materialized and how the answer changed against cold; ``gate`` for shifted."""
        prompt = chat_tokens(self.tokenizer, item["recipient_prompt"])
        donors = [chat_tokens(self.tokenizer, d["text"]) for d in item["donor_prompts"]]
        n = len(prompt)
        gold = [*self.tokenizer(item["answers"][0], add_special_tokens=False)["input_ids"], self.stop]
        runner = PrefillRunner(self.model)
        cold_last = runner.prefill(prompt, 0, 1)
        cold_cache = runner.arena.cache(n)
        cold = self._side(cold_cache, prompt, cold_last)
        answer = cold.greedy
        cold_answer_logits = self.cont.forced(cold_cache, prompt, cold_last, answer)
        cold_gold_logits = self.cont.forced(cold_cache, prompt, cold_last, gold)
        task_cold = rouge_l(cold.text, item["answers"][0])
        base = {
            "item_id": item["item_id"],
            "transform": item["transform"],
            "negative_control": bool(item.get("negative_control")),
            "prompt_tokens": n,
            "donor_tokens": [len(d) for d in donors],
            "cold_answer": cold.text,
            "gold_answer": item["answers"][0],
            "task_cold": task_cold,
        }
        out = []
        for mode in self.modes.values():
            warm = mode.run(self.model, donors, prompt)
            row = {**base, "mode": mode.name, **self._compare(warm, runner, prompt, cold_last, cold)}
            if warm.materialized:
                warm_side = self._side(warm.cache, prompt, warm.logits)
                kl, top1 = kl_top1(cold_answer_logits, self.cont.forced(warm.cache, prompt, warm.logits, answer))
                ppl_cold = perplexity(cold_gold_logits, gold)
                ppl_warm = perplexity(self.cont.forced(warm.cache, prompt, warm.logits, gold), gold)
                task_warm = rouge_l(warm_side.text, item["answers"][0])
                row |= {
                    "warm_answer": warm_side.text,
                    "mean_kl": sum(kl) / len(kl),
                    "max_kl": max(kl),
                    "top1_agreement": top1,
                    "greedy_exact_match": warm_side.greedy == cold.greedy,
                    "rouge_l_vs_cold": rouge_l(warm_side.text, cold.text),
                    "ppl_ratio": ppl_warm / ppl_cold,
                    "task_warm": task_warm,
                    "acceptable": acceptable(sum(kl) / len(kl), task_warm, task_cold),
                }
            else:  # nothing materialized: the recipient ran the same full prefill as cold
                row |= {
                    "warm_answer": cold.text,
                    "mean_kl": 0.0,
                    "max_kl": 0.0,
                    "top1_agreement": 1.0,
                    "greedy_exact_match": True,
                    "rouge_l_vs_cold": 1.0,
                    "ppl_ratio": 1.0,
                    "task_warm": task_cold,
                    "acceptable": True,
                }
            row |= warm.extra
            if mode.name == "shifted":
                verdict = gate(warm)
                row["gate"] = "none" if verdict is None else "accepted" if verdict.accepted else verdict.reason.value
            out.append(row)
        return out

    def _compare(
        self, warm: WarmRun, runner: PrefillRunner, prompt: Sequence[int], cold_last: torch.Tensor, cold: Side
    ) -> dict[str, Any]:
        """Share, decision, and the logit differences of the prompt's last position against cold."""
        decision = warm.decision
        plan = decision.plan if decision is not None else None
        row: dict[str, Any] = {
            "materialized": warm.materialized,
            "share": warm.materialized / len(prompt),
            "declined": warm.declined,
            "plan_mode": plan.mode if plan is not None else None,
            "estimated_deviation": plan.estimated_deviation if plan is not None else None,
            "spans": [(s.target_start, s.length, s.delta) for s in plan.spans] if plan is not None else [],
            "max_abs_logit_diff": float((warm.logits - cold_last).abs().max()),
        }
        if warm.materialized and plan is not None and plan.mode == "exact":
            # Bit-exactness of the copy: cold's own K/V of the reused prefix, then the rest, as the warm run split it.
            split = PrefillRunner(self.model, capacity=len(prompt))
            m = warm.materialized
            split.arena.kv[:, :, :, :m].copy_(runner.arena.kv[:, :, :, :m])
            row["split_max_abs_logit_diff"] = float((split.prefill(prompt, m, 1) - warm.logits).abs().max())
        return row
