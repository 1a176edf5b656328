"""The one registry of names (`opto.search.registry`): every name a user can give, for the
Python API and the `opto` command alike, and names of one's own."""

from __future__ import annotations

import pytest

import opto
from opto import AggregatedUpdate, Greedy, OptoKeyError, OptoTypeError, OptoValueError, ScriptedModel, TopK
from opto.cli import main
from opto.finetune import NeMoCustomizerAdapter, OpenAIFineTuneAdapter, TRLAdapter
from opto.preference import FORMATS, get_writer
from opto.search import registry
from opto.search.candidates import MergedAndEach


# What makers may ask for, as a step or a command offers it.
CONTEXT = {"n": 3, "usd": 1.0, "seconds": 60.0, "steps": 2, "score": 0.9, "path": "STOP"}


@pytest.mark.parametrize("kind", sorted(registry.KINDS))
def test_every_registered_name_makes_an_object_of_its_kinds_protocol(kind):
    protocol = registry._load(registry.KINDS[kind].protocol)
    for name in registry.names(kind):
        maker = registry.lookup(kind, name)
        if kind in ("preference format", "finetune backend"):  # classes of a base class, made with settings
            assert issubclass(maker, protocol), (kind, name)
        else:
            context = {**CONTEXT, "aggregator": opto.Aggregator(ScriptedModel([]))}
            assert isinstance(registry.make(kind, name, **context), protocol), (kind, name)


def test_the_search_kinds_make_their_objects_from_names():
    assert isinstance(registry.make("selection", "top_k"), TopK)
    assert isinstance(registry.make("stop", "max_calls", n=5), opto.MaxCalls)
    aggregator = opto.Aggregator(ScriptedModel([]))
    both = registry.make("candidates", "both", aggregator=aggregator)  # the step offers its aggregator
    assert isinstance(both, MergedAndEach) and both.merged.aggregator is aggregator
    mine = Greedy()
    assert registry.make("selection", mine) is mine  # an object of the protocol is used as it is


def test_a_name_that_is_not_registered_is_an_error_listing_the_names():
    with pytest.raises(OptoValueError, match=r"selection must be one of 'greedy', 'pareto'.*got 'best'"):
        registry.make("selection", "best")
    with pytest.raises(OptoValueError, match="unknown backend 'sagemaker'; use one of openai, nemo, trl, art"):
        registry.lookup("finetune backend", "sagemaker")
    with pytest.raises(OptoKeyError, match="no kind 'optimizer'"):
        registry.names("optimizer")


class Prompted(opto.Agent):
    def __init__(self):
        self.prompt = opto.Parameter("Answer.")

    def forward(self, x):
        return x


def test_the_trainer_takes_the_same_names_and_says_which_are_known():
    model = ScriptedModel([])
    trainer = AggregatedUpdate(Prompted(), opto.Optimizer(model), selection="top_k", candidates="both")
    assert isinstance(trainer.selector, TopK) and isinstance(trainer.candidate_source, MergedAndEach)
    with pytest.raises(OptoValueError, match="components must be one of 'all', 'round_robin'"):
        AggregatedUpdate(Prompted(), opto.Optimizer(model), components="some")
    with pytest.raises(OptoValueError, match="validation must be one of 'minibatch', 'none', a dataset"):
        AggregatedUpdate(Prompted(), opto.Optimizer(model), validation="holdout")


def test_a_registered_name_of_ones_own_works_in_the_trainer(monkeypatch):
    monkeypatch.setitem(registry.KINDS, "selection", registry.Kind("selection", registry.KINDS["selection"].protocol,
                                                                   dict(registry.KINDS["selection"].entries)))  # fmt: skip
    opto.register("selection", "best_of_3", lambda: TopK(3))
    trainer = AggregatedUpdate(Prompted(), opto.Optimizer(ScriptedModel([])), selection="best_of_3")
    assert isinstance(trainer.selector, TopK) and trainer.selector.k == 3
    opto.register("selection", "by_path", "opto.search.selection:Greedy")  # an import path, loaded when asked
    assert isinstance(registry.make("selection", "by_path"), Greedy)


def test_a_maker_that_makes_the_wrong_kind_and_bad_registrations_are_refused(monkeypatch):
    monkeypatch.setitem(registry.KINDS, "components", registry.Kind("components", registry.KINDS["components"].protocol,
                                                                    dict(registry.KINDS["components"].entries)))  # fmt: skip
    opto.register("components", "wrong", lambda: TopK(2))
    with pytest.raises(OptoTypeError, match="components 'wrong' made a TopK, not a ComponentSelector"):
        registry.make("components", "wrong")
    with pytest.raises(OptoTypeError, match="register a class, a callable or a 'module:attribute' path"):
        opto.register("components", "bad", "no_colon")
    with pytest.raises(OptoValueError, match="non-empty str"):
        opto.register("components", "", Greedy)


def test_preference_formats_and_backends_come_from_the_registry():
    assert registry.names("preference format") == list(FORMATS)  # every format has its record schema
    assert type(get_writer("trl-chat")).__name__ == "TRLChatWriter"
    assert registry.lookup("finetune backend", "nemo") is NeMoCustomizerAdapter
    with pytest.raises(OptoValueError, match="unknown format 'csv'"):
        get_writer("csv")


def test_the_command_offers_the_registrys_names(capsys):
    with pytest.raises(SystemExit):
        main(["export", "RUN", "--format", "csv"])
    err = capsys.readouterr().err
    assert "'openai-dpo', 'openai-sft', 'trl', 'trl-chat', 'nemo', 'art'" in err
    with pytest.raises(SystemExit):
        main(["finetune", "status", "JOB", "--backend", "sagemaker"])
    assert "'openai', 'nemo', 'trl', 'art'" in capsys.readouterr().err


def test_the_adapter_base_saves_and_restores_settings_and_jobs(tmp_path):
    adapter = OpenAIFineTuneAdapter("base-model", method="supervised", base_url="http://127.0.0.1:9", api_key="sk-x")
    adapter.jobs.append(opto.finetune.TrainingJobRef(job_id="j1", backend="openai", base_model="b", method="dpo"))
    state = adapter.state_dict()
    assert state["backend"] == "openai" and state["settings"]["method"] == "supervised"
    assert "sk-x" not in str(state)
    restored = OpenAIFineTuneAdapter.from_state_dict(state, api_key="sk-y", timeout=5.0)
    assert restored.method == "supervised" and restored.timeout == 5.0 and [j.job_id for j in restored.jobs] == ["j1"]
    with pytest.raises(OptoValueError, match="saved by a 'openai' adapter, not by NeMoCustomizerAdapter"):
        NeMoCustomizerAdapter.from_state_dict(state)
    trl = TRLAdapter("model", output_dir=tmp_path)
    with pytest.raises(OptoValueError, match="TRLAdapter saves no state: its jobs live in their folders"):
        trl.state_dict()
