"""Where the tests keep the results of their expensive, deterministic checks (sm_90 builds, the
GPU suite's dry runs) between runs: outside the repository, keyed by everything that decides
them, so a check runs again only when one of its inputs changed.

``FWRL_TEST_CACHE=DIR`` moves it (default ``~/.cache/fwrl/tests``); ``FWRL_TEST_CACHE=`` (empty)
turns it off, so every check runs.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(name: str) -> Path | None:
    """The cache folder of one kind of result, or None when caching is off."""
    root = os.environ.get("FWRL_TEST_CACHE", str(Path.home() / ".cache" / "fwrl" / "tests"))
    return Path(root) / name if root else None
