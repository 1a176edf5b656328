"""Where users already are: opto's search for DSPy programs (`opto.integrations.dspy`)
and GEPA adapters (`opto.integrations.gepa`).

Each integration imports its framework only when used, and the framework is an optional
extra, never a dependency of opto.
"""

__all__: list[str] = []
