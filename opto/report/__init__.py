"""Reading a run back: the Markdown report (`opto report`), the HTML report, the bars of
a prompts-then-weights chain, and MLflow tracking (`MLflowCallback`)."""

__all__: list[str] = []
