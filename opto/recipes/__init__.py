"""Ready-made runs: the offline demo (`opto demo`) and the prompts-then-weights chain
(`opto demo --finetune`, `prompts_then_weights`)."""

__all__: list[str] = []
