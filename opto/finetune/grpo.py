"""GRPO on stored trajectory groups: the loss `TRLAdapter(method="grpo")` trains with.

TRL's `GRPOTrainer` draws its completions from the policy while it trains (its rollout
function generates them); it has no way to take completions that were sampled earlier,
with their rewards, as they are. So the worker applies GRPO's objective to the stored
groups itself, in a small loop over the same Hugging Face model (LoRA optional):

- each group's rewards become advantages, (reward - group mean) / (group std + 1e-6);
  a group whose rewards are all equal teaches nothing and is dropped (counted);
- every assistant reply of a trajectory (the last call's choice and each additional
  history's) is a completion, scored under the model's chat template given the messages
  before it;
- the loss is the mean over completions of -advantage x (mean log-probability of the
  completion's tokens), plus, with `beta` > 0, `beta` x the k3 estimate of the KL
  divergence from the starting model (exp(ref - logp) - (ref - logp) - 1 per token).

As the samples are off-policy (drawn earlier, possibly by another model) there is no
importance ratio or clipping: this is GRPO's advantage weighting of stored samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["LORA_BASE", "ScoredReply", "batch_logprobs", "completions_of", "grpo_loss"]

#: `grpo_loss(reference=LORA_BASE)`: the LoRA model itself with its adapters off (no second copy).
LORA_BASE = "the LoRA model's base"


@dataclass
class ScoredReply:
    """One assistant reply to learn from: its prompt (chat messages), its text and its advantage."""

    prompt: list[dict[str, Any]]
    text: str
    advantage: float


def completions_of(groups: list[dict[str, Any]]) -> tuple[list[ScoredReply], int]:
    """The completions of every group with varying rewards, and the number of groups dropped."""
    completions: list[ScoredReply] = []
    dropped = 0
    for group in groups:
        trajectories = group.get("trajectories") or []
        rewards = [float(t["reward"]) for t in trajectories]
        if len(rewards) < 2 or statistics.pstdev(rewards) == 0:
            dropped += 1
            continue
        mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
        for trajectory, reward in zip(trajectories, rewards):
            advantage = (reward - mean) / (std + 1e-6)
            histories = [
                trajectory["messages_and_choices"],
                *(h["messages_and_choices"] for h in trajectory.get("additional_histories") or []),
            ]
            for history in histories:
                *before, last = history
                reply = last.get("message", last)
                completions.append(ScoredReply([_chat(m) for m in before], str(reply.get("content") or ""), advantage))
    return completions, dropped


def _chat(message: dict[str, Any]) -> dict[str, Any]:
    """A message or an ART choice as {"role", "content"} for a chat template."""
    inner = message.get("message", message) if "finish_reason" in message else message
    return {"role": str(inner.get("role")), "content": str(inner.get("content") or "")}


def batch_logprobs(model: Any, tokenizer: Any, completions: list[ScoredReply]) -> list[Any]:
    """The log-probability of each reply token of each completion (a 1-d tensor each), from
    one forward pass over them all: on a CPU that costs a fraction of one pass per reply.
    The rows are padded on the left, so every reply ends at the last position and the
    vocabulary-wide logits are computed for the reply tokens only (a 49k-token vocabulary
    over whole prompts was most of a step's memory)."""
    import torch

    rows: list[list[int]] = []
    lengths: list[int] = []  # reply tokens per row
    for completion in completions:
        prompt = tokenizer.apply_chat_template(completion.prompt, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*completion.prompt, {"role": "assistant", "content": completion.text}], tokenize=False
        )
        if not full.startswith(prompt):  # a template that rewrites earlier turns: score the reply on its own
            full = prompt + completion.text
        row = tokenizer(full, add_special_tokens=False).input_ids
        rows.append(row)
        lengths.append(len(row) - len(tokenizer(prompt, add_special_tokens=False).input_ids))
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    keep = max(lengths) + 1  # the logits at position t predict token t + 1
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    out = []
    for index, length in enumerate(lengths):
        targets = ids[index, width - length :]
        scored = logprobs[index, keep - 1 - length : keep - 1]
        out.append(scored.gather(1, targets.unsqueeze(1)).squeeze(1))
    return out


def grpo_loss(
    model: Any, tokenizer: Any, completions: list[ScoredReply], *, beta: float = 0.0, reference: Any = None
) -> Any:
    """The mean GRPO loss over `completions` (see the module); `reference` scores the KL
    term: a model, or `LORA_BASE` for a LoRA model (peft) measured against its own base."""
    import torch

    total = torch.zeros(())
    if not completions:
        return total
    policy = batch_logprobs(model, tokenizer, completions)
    if beta > 0 and reference is not None:
        with torch.no_grad():
            if reference is LORA_BASE:
                with model.disable_adapter():
                    anchored = batch_logprobs(model, tokenizer, completions)
            else:
                anchored = batch_logprobs(reference, tokenizer, completions)
    for index, (completion, logprobs) in enumerate(zip(completions, policy)):
        if logprobs.numel() == 0:
            continue
        loss = -completion.advantage * logprobs.mean()
        if beta > 0 and reference is not None:
            delta = anchored[index] - logprobs
            loss = loss + beta * (torch.exp(delta) - delta - 1).mean()
        total = total + loss
    return total / len(completions)
