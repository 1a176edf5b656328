"""Search strategies, each a small object behind a protocol of its own.

Here: where candidates come from (`CandidateSource`: "merged", "each", "both") and which
parameters a step proposes for (`ComponentSelector`: "all", "round_robin"). Beside them:
acceptance policies in `opto.trainer.validation` (`Validation`, `MinibatchFirst`), the
Pareto pool and its merge of lineages in `opto.trainer.selection` and
`opto.trainer.merge`, and stop conditions in `opto.stopping`.
"""

from .candidates import CandidateSource, EachProposal, MergedAndEach, MergedCandidates, make_candidate_source
from .components import AllComponents, ComponentSelector, RoundRobin, focused, make_component_selector

__all__ = ["AllComponents", "CandidateSource", "ComponentSelector", "EachProposal", "MergedAndEach",
           "MergedCandidates", "RoundRobin", "focused", "make_candidate_source", "make_component_selector"]
