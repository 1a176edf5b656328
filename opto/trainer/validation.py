"""Moved to `opto.search.acceptance`; this path keeps working."""

from ..search.acceptance import (
    DatasetValidation,
    Decision,
    MinibatchFirst,
    MinibatchValidation,
    NoValidation,
    Validation,
    ValidationContext,
    check_alpha,
    holm_corrected,
    make_validation,
)

__all__ = [
    "DatasetValidation",
    "Decision",
    "MinibatchFirst",
    "MinibatchValidation",
    "NoValidation",
    "Validation",
    "ValidationContext",
    "check_alpha",
    "holm_corrected",
    "make_validation",
]
