"""Small benchmark datasets shipped with opto."""

from opto.datasets.bigbench import SPLIT_FRACTIONS, bigbench, bigbench_tasks

__all__ = ["SPLIT_FRACTIONS", "bigbench", "bigbench_tasks"]
