"""MLflowCallback against a local file-store tracking URI (no server)."""

import pytest
from mlflow.tracking import MlflowClient

from opto import ExactMatchGuide
from opto.report.tracking import MLflowCallback
from world import dataset, make_level_trainer


def test_a_run_is_tracked_with_step_metrics_and_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store needs no server
    uri = (tmp_path / "mlruns").as_uri()
    callback = MLflowCallback(tracking_uri=uri, experiment="opto-test", run_name="level")
    trainer, *_ = make_level_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), test_dataset=dataset([0, 1, 5]),
                           run_dir=tmp_path / "run", progress=False, shuffle=False, callbacks=[callback])
    client = MlflowClient(uri)
    run = client.get_run(callback.run_id)
    assert run.info.status == "FINISHED" and run.data.params["batch_size"] == "1"
    assert [m.step for m in client.get_metric_history(callback.run_id, "score")] == [1, 2, 3]
    assert [m.value for m in client.get_metric_history(callback.run_id, "accepted")] == [1.0, 1.0, 1.0]
    tests = client.get_metric_history(callback.run_id, "test_score")
    assert [(m.step, m.value) for m in tests] == [(s, v) for s, v in result.test_scores]
    artifacts = {a.path for a in client.list_artifacts(callback.run_id)}
    assert artifacts == {"final_parameters.json", "report.png", "report.md"}


def test_a_missing_mlflow_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name.startswith("mlflow"):
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(ImportError, match=r'pip install -e ".\[mlflow\]"'):
        MLflowCallback()
