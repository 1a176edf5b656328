"""Benchmark datasets: BIG-bench tasks shipped with opto, and a reader for any BIG-bench task file."""

from .bigbench import SPLIT_FRACTIONS, bigbench, bigbench_tasks, load_bigbench

__all__ = ["SPLIT_FRACTIONS", "bigbench", "bigbench_tasks", "load_bigbench"]
