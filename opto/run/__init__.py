"""What a run records: the typed ledger events, the run directory (`RunDir`) and its
checkpoint, `Callback` hooks, the results a run returns (`TrainResult`, `EvalResult`) and
the model switches recorded after fine-tuning.

The public names are re-exported from `opto`; import them from there.
"""

__all__: list[str] = []
