"""Search strategies, each a small object behind a protocol of its own.

Here: where candidates come from (`CandidateSource`: "merged", "each", "both"). Beside
it: acceptance policies in `opto.trainer.validation` (`Validation`, `MinibatchFirst`),
the Pareto pool and its merge of lineages in `opto.trainer.selection` and
`opto.trainer.merge`, and stop conditions in `opto.stopping`.
"""

from .candidates import CandidateSource, EachProposal, MergedAndEach, MergedCandidates, make_candidate_source

__all__ = ["CandidateSource", "EachProposal", "MergedAndEach", "MergedCandidates", "make_candidate_source"]
