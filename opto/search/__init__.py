"""Search strategies, each a small object behind a protocol of its own, one module a kind.

- candidate selection: which values a step starts from (`CandidateSelector`: `Greedy`,
  `Pareto`, `EpsilonGreedy`, `TopK`; `opto.search.selection`), and the pool of validated
  candidates it draws from (`opto.search.pool`);
- candidate sources: where a step's candidates come from (`CandidateSource`: "merged",
  "each", "both"; `opto.search.candidates`);
- component selection: which parameters a step proposes for (`ComponentSelector`: "all",
  "round_robin"; `opto.search.components`);
- acceptance: whether a candidate is accepted (`Validation`: `MinibatchValidation`,
  `DatasetValidation`, `MinibatchFirst`; `opto.search.acceptance`), and the default
  validation split (`HoldOut`; `opto.search.holdout`);
- proposal batching: who is asked once a step, who per rollout (`ProposalBatching`:
  "reflective", "per_instance"; `opto.search.batching`);
- the merge of lineages (`LineageMerge`; `opto.search.merge`);
- stop conditions (`StopCondition`: `MaxCalls`, `MaxCost`, ...; `opto.search.stopping`);
- numeric and categorical knobs by Bayesian search (`TPEProposer`; `opto.search.tpe`).

The old paths (`opto.trainer.validation`, `opto.trainer.selection`, `opto.trainer.merge`,
`opto.stopping`) keep working.
"""

from .acceptance import DatasetValidation, MinibatchFirst, MinibatchValidation, NoValidation, Validation
from .batching import PerInstance, ProposalBatching, Reflective, make_batching
from .candidates import CandidateSource, EachProposal, MergedAndEach, MergedCandidates, make_candidate_source
from .components import AllComponents, ComponentSelector, RoundRobin, focused, make_component_selector
from .holdout import HoldOut
from .merge import LineageMerge
from .selection import CandidateSelector, EpsilonGreedy, Greedy, Pareto, TopK, make_selector
from .tpe import TPEProposer

__all__ = [
    "AllComponents",
    "CandidateSelector",
    "CandidateSource",
    "ComponentSelector",
    "DatasetValidation",
    "EachProposal",
    "EpsilonGreedy",
    "Greedy",
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
    "make_batching",
    "make_candidate_source",
    "make_component_selector",
    "make_selector",
]
