"""Reading a parameter update out of a model's reply, and checking it.

Two steps, kept apart so the caller can record each in its ledger:

1. `extract_with_method(reply)` finds the suggested values in the model's text, trying
   a chain of parsers from the most exact to the most forgiving (`loose_json.py`), and
   reads what they mean (`suggestion.py`): the values, "no change", or nothing.
2. `construct_update(parameters, suggestion)` coerces each value to its parameter's
   type and validates it (`opto.extraction.coercion`, next to `Parameter`).

The expected reply is ``{"reasoning": "...", "suggestion": {name: value, ...}}``; a bare
``TERMINATE`` or an empty suggestion means "no change".
"""

from .coercion import SkippedValue, UpdateError, UpdateResult, construct_update, construct_update_dict
from .loose_json import MAX_DEPTH
from .suggestion import (
    BOOKKEEPING_KEYS,
    EXTRACTION_METHODS,
    SUGGESTION_KEYS,
    WRAPPER_KEYS,
    Extraction,
    ExtractionError,
    extract_llm_suggestion,
    extract_with_method,
)

__all__ = [
    "BOOKKEEPING_KEYS",
    "EXTRACTION_METHODS",
    "MAX_DEPTH",
    "SUGGESTION_KEYS",
    "WRAPPER_KEYS",
    "Extraction",
    "ExtractionError",
    "SkippedValue",
    "UpdateError",
    "UpdateResult",
    "construct_update",
    "construct_update_dict",
    "extract_llm_suggestion",
    "extract_with_method",
]
