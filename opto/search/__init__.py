"""Search strategies, each a small object behind a protocol of its own: where candidates
come from (`CandidateSource`). Stop conditions are in `opto.stopping`; acceptance
policies (`MinibatchFirst` among them) in `opto.trainer.validation`."""

from .candidates import CandidateSource, EachProposal, MergedAndEach, MergedCandidates, make_candidate_source

__all__ = ["CandidateSource", "EachProposal", "MergedAndEach", "MergedCandidates", "make_candidate_source"]
