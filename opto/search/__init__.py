"""The search: every piece of a step between the rollouts and the applied update, one
module a kind, each a small object behind a protocol of its own.

- proposers: who suggests updates (`Proposer`, `BatchProposer`: `Optimizer`,
  `DemoProposer`; `opto.search.proposers`; `TPEProposer` in `opto.search.tpe`), and the
  few-shot demo rules they follow (`opto.search.demo_rules`);
- the aggregator: proposals merged into candidates (`Aggregator`; `opto.search.aggregation`);
- candidate sources: where a step's candidates come from (`CandidateSource`: "merged",
  "each", "both"; `opto.search.candidates`);
- component selection: which parameters a step proposes for (`ComponentSelector`: "all",
  "round_robin"; `opto.search.components`);
- proposal batching: who is asked once a step, who per rollout (`ProposalBatching`:
  "reflective", "per_instance"; `opto.search.batching`);
- validation: whether a candidate is accepted (`Validation`: `MinibatchValidation`,
  `DatasetValidation`, `MinibatchFirst`; `opto.search.validation`), and the default
  validation split (`HoldOut`; `opto.search.holdout`);
- what a run returns: the final check against the start (`FinalCheck`;
  `opto.search.final_check`), and no credit for copying examples (`CopyGuard`;
  `opto.search.copies`);
- candidate selection: which values a step starts from (`CandidateSelector`: `Greedy`,
  `Pareto`, `EpsilonGreedy`, `TopK`; `opto.search.selection`), and the pool of validated
  candidates it draws from (`opto.search.pool`); the merge of lineages (`LineageMerge`;
  `opto.search.merge`);
- stop conditions (`StopCondition`: `MaxCalls`, `MaxCost`, ...; `opto.search.stopping`).

Every option that takes a name turns it into its object through one registry
(`opto.search.registry`), which `register` extends.
"""

from .batching import PerInstance, ProposalBatching, Reflective
from .candidates import CandidateSource, EachProposal, MergedAndEach, MergedCandidates
from .components import AllComponents, ComponentSelector, RoundRobin, focused
from .copies import CopyGuard
from .final_check import FinalCheck
from .holdout import HoldOut
from .merge import LineageMerge
from .selection import CandidateSelector, EpsilonGreedy, Greedy, Pareto, TopK
from .tpe import TPEProposer
from .validation import DatasetValidation, MinibatchFirst, MinibatchValidation, NoValidation, Validation

__all__ = [
    "AllComponents",
    "CandidateSelector",
    "CandidateSource",
    "ComponentSelector",
    "DatasetValidation",
    "EachProposal",
    "EpsilonGreedy",
    "Greedy",
    "CopyGuard",
    "FinalCheck",
    "HoldOut",
    "LineageMerge",
    "MergedAndEach",
    "MergedCandidates",
    "MinibatchFirst",
    "MinibatchValidation",
    "NoValidation",
    "Pareto",
    "PerInstance",
    "ProposalBatching",
    "Reflective",
    "RoundRobin",
    "TPEProposer",
    "TopK",
    "Validation",
    "focused",
]
