"""A step's instances are pipelined: each goes agent -> guide -> proposers as soon as it can,
and the ledger does not depend on which call came back first."""

from __future__ import annotations

import asyncio
import json

import pytest

from opto import AggregatedUpdate, ExactMatchGuide, Optimizer, RunDir
from opto.llm import BudgetExceeded, ScriptedModel
from opto.executors.local import AsyncioExecutor
from world import LevelAgent, agent_reply, dataset, make_brain, role_of

TRAIN = {"progress": False, "shuffle": False}


class OneSlowAgent(LevelAgent):
    """Input 0 waits until the proposers have been asked about input 1 (at most 5 s)."""

    def __init__(self, model, optimizer_asked: asyncio.Event | None = None):
        super().__init__(model)
        self.optimizer_asked = optimizer_asked or asyncio.Event()
        self.waited_for_the_optimizer: bool | None = None

    async def forward(self, x):
        if x == 0 and self.waited_for_the_optimizer is None:  # the step's own rollout
            try:
                await asyncio.wait_for(self.optimizer_asked.wait(), 5)
                self.waited_for_the_optimizer = True
            except TimeoutError:
                self.waited_for_the_optimizer = False
        return await super().forward(x)


def signalling_brain(event: asyncio.Event, log: list[str]):
    respond = make_brain()

    def brain(messages):
        if role_of(messages) == "optimizer":
            log.append(messages[-1]["content"])
            event.set()
        return respond(messages)

    return brain


def test_an_instance_is_proposed_for_while_a_slower_rollout_still_runs(tmp_path):
    asked, prompts = asyncio.Event(), []
    agent = OneSlowAgent(ScriptedModel(agent_reply), asked)
    brain = ScriptedModel(signalling_brain(asked, prompts))
    trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None)
    trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, run_dir=tmp_path, **TRAIN)

    assert agent.waited_for_the_optimizer is True
    assert len(prompts) == 2  # one proposal per instance, none twice
    # Events are added in batch order, whatever the order the calls finished in.
    train_events = [(e["type"], e["instance_id"]) for e in RunDir(tmp_path).ledger()
                    if e["type"] in ("rollout", "proposal") and e.get("phase", "train") == "train"]
    assert train_events == [("rollout", "x0"), ("rollout", "x1"), ("proposal", "x0"), ("proposal", "x1")]


def test_an_executor_that_reports_nothing_as_it_goes_still_gets_every_instance_proposed_once(tmp_path):
    class WholeBatchExecutor(AsyncioExecutor):
        async def run(self, agent, guide, examples, *, on_result=None, **kwargs):
            return await super().run(agent, guide, examples, **kwargs)  # on_result dropped

    brain = ScriptedModel(make_brain())
    trainer = AggregatedUpdate(LevelAgent(ScriptedModel(agent_reply)), Optimizer(brain), llm=brain,
                               executor=WholeBatchExecutor(), proposals="per_instance", validation="minibatch", final_check=None)
    trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), batch_size=3, run_dir=tmp_path, **TRAIN)
    proposals = [e["instance_id"] for e in RunDir(tmp_path).ledger() if e["type"] == "proposal"]
    assert proposals == ["x0", "x1", "x2"]


def test_proposals_made_before_a_step_stops_are_in_its_partial_record(tmp_path):
    calls = []

    def brain(messages):
        if role_of(messages) == "optimizer":
            calls.append(1)
            if len(calls) == 2:
                raise BudgetExceeded("the budget is spent (test)")
        return make_brain()(messages)

    model = ScriptedModel(brain)
    trainer = AggregatedUpdate(LevelAgent(ScriptedModel(agent_reply)), Optimizer(model), llm=model, concurrency=1, proposals="per_instance", validation="minibatch", final_check=None)
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, run_dir=tmp_path, **TRAIN)
    assert "budget" in (result.stopped_reason or "")
    ledger = RunDir(tmp_path).ledger()
    proposals = [e for e in ledger if e["type"] == "proposal"]
    assert len(proposals) == 1 and json.dumps(proposals[0]["update"]) == '{"system_prompt": "level 1"}'


@pytest.mark.parametrize("validation", ["none", "minibatch"])
def test_a_scripted_step_decides_the_same_with_or_without_pipelining(tmp_path, validation):
    """The executor without on_result runs the old barrier step; the decisions agree."""

    class Barrier(AsyncioExecutor):
        async def run(self, agent, guide, examples, *, on_result=None, **kwargs):
            return await super().run(agent, guide, examples, **kwargs)

    decisions = []
    for name, executor in (("pipelined", None), ("barrier", Barrier())):
        brain = ScriptedModel(make_brain())
        trainer = AggregatedUpdate(LevelAgent(ScriptedModel(agent_reply)), Optimizer(brain), llm=brain,
                                   executor=executor, validation=validation, proposals="per_instance")
        trainer.train(ExactMatchGuide(), dataset([0, 1, 2, 3]), batch_size=2, run_dir=tmp_path / name, **TRAIN)
        decisions.append([{k: v for k, v in e.items() if k not in ("candidate_id", "time")}
                          for e in RunDir(tmp_path / name).ledger() if e["type"] in ("decision", "applied")])
    assert decisions[0] == decisions[1] and decisions[0]
