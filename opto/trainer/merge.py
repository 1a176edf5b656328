"""Moved to `opto.search.merge`; this path keeps working."""

from ..search.merge import LineageMerge, MergePlan

__all__ = ["LineageMerge", "MergePlan"]
