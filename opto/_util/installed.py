"""What `opto --version` says: the version, and whether another distribution also
installs a top-level `opto` package (Trace's `trace-opt` does)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from .._version import DISTRIBUTION, __version__


def other_distributions(path: list[str] | None = None) -> list[str]:
    """Installed distributions other than opto's own that provide the import name `opto`
    (on `path`, default `sys.path`).

    Two distributions writing into one `site-packages/opto/` folder overwrite each other's
    files; whichever was installed last wins file by file, so neither works reliably.
    """
    found = set()
    found_in = importlib.metadata.distributions() if path is None else importlib.metadata.distributions(path=path)
    for dist in found_in:
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-") != DISTRIBUTION and _provides_opto(dist):
            found.add(name)
    return sorted(found)


def _provides_opto(dist: importlib.metadata.Distribution) -> bool:
    top_level = (dist.read_text("top_level.txt") or "").split()
    return "opto" in top_level or any(file.parts[:1] == ("opto",) for file in dist.files or [])


def version_text() -> str:
    """The text `opto --version` prints: name, version, location, and any clash."""
    location = Path(__file__).resolve().parents[1]
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
