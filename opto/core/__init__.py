"""The agent core: `Parameter` and `Demos`, `Agent`, prompt templates, output schemas,
`Example` and data loading, `Guide` and `Feedback`, a `Rollout` (one run of the agent,
judged), and the statistics every score is reported with.

The public names are re-exported from `opto`; import them from there.
"""

__all__: list[str] = []
