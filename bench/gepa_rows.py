"""GEPA on a `bench/landscapes.py` landscape: the same examples, agent and scripted optimizer,
behind GEPA's `GEPAAdapter` and `reflection_lm`, with calls counted as for opto (one per
example evaluated, one per reflection call).

GEPA is the benchmark's peer, never a dependency of opto: `pip install gepa==0.1.4`.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from landscapes import Landscape, failures_in

_COMPONENT = re.compile(r"You are changing the parameter (\w+)\.")
_BLOCK = re.compile(r"```\n?(.*?)\n?```", re.S)


def _import_gepa() -> Any:
    try:
        import gepa
    except ImportError as exc:
        raise SystemExit("the GEPA rows need GEPA in this environment: pip install gepa==0.1.4") from exc
    return gepa


class _Quiet:
    def log(self, message: str) -> None:
        pass


class LandscapeAdapter:
    """A `GEPAAdapter` over a landscape: each example evaluated is one call (`calls[0]`)."""

    propose_new_texts = None

    def __init__(self, landscape: Landscape, calls: list[int]) -> None:
        self.landscape, self.calls = landscape, calls

    def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa.core.adapter import EvaluationBatch

        self.calls[0] += len(batch)
        outputs = [self.landscape.answer(candidate, e["x"]) for e in batch]
        scores = [1.0 if out == e["info"] else 0.0 for out, e in zip(outputs, batch)]
        return EvaluationBatch(outputs=outputs, scores=scores,
                               trajectories=list(zip(batch, outputs, scores)) if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]):
        records = [{"Inputs": e["x"], "Generated Outputs": out,
                    "Feedback": f"score: {score:g}. " + ("Right." if score else f"The answer is {e['info']}.")}
                   for e, out, score in eval_batch.trajectories]
        return {name: records for name in components_to_update}


def scripted_reflection(landscape: Landscape, seed: int, calls: list[int]) -> Any:
    """GEPA's `reflection_lm`: the landscape's scripted optimizer reading GEPA's reflection
    prompt (the component named in front, its current text in the first code block); each
    call counted in `calls[0]`."""

    def reflection_lm(prompt: str) -> str:
        calls[0] += 1
        name = _COMPONENT.search(prompt).group(1)
        blocks = _BLOCK.findall(prompt)
        current = blocks[0].strip() if blocks else ""
        proposal = landscape.reflect({name: current}, failures_in(prompt), seed)
        return f"```\n{proposal.get(name, current)}\n```"

    return reflection_lm


def run_gepa(landscape: Landscape, seed: int, budget: int, *, use_merge: bool = False) -> list[tuple[int, float]]:
    """(calls so far, expected score of the candidate GEPA would return) after each iteration."""
    gepa = _import_gepa()
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    validation = landscape.validation_set()
    calls = [0]
    curve: list[tuple[int, float]] = []

    reflection_lm = scripted_reflection(landscape, seed, calls)

    def stop(state: Any) -> bool:
        means = [statistics.fmean(s.values()) if s else float("-inf") for s in state.prog_candidate_val_subscores]
        best = max(range(len(means)), key=lambda i: means[i])  # what GEPA returns: the best validation mean
        curve.append((calls[0], landscape.expected_score(state.program_candidates[best], validation)))
        return calls[0] >= budget

    template = InstructionProposalSignature.default_prompt_template
    gepa.optimize(
        seed_candidate={name: "" for name in landscape.parts},
        trainset=[dict(e) for e in landscape.train_set()],
        valset=[dict(e) for e in validation],
        adapter=LandscapeAdapter(landscape, calls),
        reflection_lm=reflection_lm,
        reflection_prompt_template={name: f"You are changing the parameter {name}.\n{template}"
                                    for name in landscape.parts},
        use_merge=use_merge,
        stop_callbacks=[stop],
        seed=seed,
        display_progress_bar=False,
        logger=_Quiet(),
        raise_on_exception=True,
    )
    return curve
