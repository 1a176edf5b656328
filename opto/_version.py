"""The version of opto, read by the build (hatch) and by `opto --version`."""

__version__ = "0.1.0"

#: The name opto is installed under; the import name is `opto`.
DISTRIBUTION = "opto-agents"
