"""What `opto --version` says: the version, and whether another distribution also
installs a top-level `opto` package (Trace's `trace-opt` does)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from ._version import DISTRIBUTION, __version__


def other_distributions() -> list[str]:
    """Installed distributions other than opto's own that provide the import name `opto`.

    Two distributions writing into one `site-packages/opto/` folder overwrite each other's
    files; whichever was installed last wins file by file, so neither works reliably.
    """
    providers = importlib.metadata.packages_distributions().get("opto", [])
    return sorted({name for name in providers if name.lower().replace("_", "-") != DISTRIBUTION})


def version_text() -> str:
    """The text `opto --version` prints: name, version, location, and any clash."""
    location = Path(__file__).resolve().parent
    lines = [f"{DISTRIBUTION} {__version__} (import name opto, at {location})"]
    for name in other_distributions():
        try:
            theirs = f" {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            theirs = ""
        lines.append(
            f"warning: {name}{theirs} is also installed and also provides the import name `opto` "
            f"(Microsoft Trace's package is `trace-opt`). The two overwrite each other's files: "
            f"use separate virtual environments, or `pip uninstall {name}` and reinstall {DISTRIBUTION}."
        )
    return "\n".join(lines)
