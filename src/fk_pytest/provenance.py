"""Which suite produced a report: its version and, when it runs from a checkout, the commit.

The leaderboard only ranks reports of one suite against each other, so the report records these
next to the device, seed and candidate hash. "Dirty" looks at the code that makes the numbers
(``src``, ``kernels_reference``, ``tasks``), not at docs or tests. A wheel install has no commit (``None``); so does a
package that merely sits inside someone else's git repository (a virtual environment in a user's
project): the commit counts only when the repository is this project's own checkout.
"""
from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Optional

PACKAGE_DIR = Path(__file__).resolve().parent
CODE_DIRS = ("src", "kernels_reference", "tasks")  # relative to the checkout's root


@functools.lru_cache(maxsize=None)  # one git call per process, not one per rewritten report
def suite_info() -> dict:
    """``{name, version, commit, dirty}``; ``dirty``: the suite's tracked code differs from the commit."""
    return {"name": "fastkernels", "version": _version(), **checkout_state(PACKAGE_DIR)}


def _version() -> Optional[str]:
    try:
        return importlib.metadata.version("fastkernels")
    except importlib.metadata.PackageNotFoundError:
        return None


def checkout_state(package_dir: Path) -> dict:
    def git(*args) -> str:
        done = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True,
                              timeout=10)
        if done.returncode != 0:
            raise OSError(done.stderr.strip())
        return done.stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top / "src" / package_dir.name != package_dir:
            return {"commit": None, "dirty": None}
        code = [f":(top){d}" for d in CODE_DIRS]
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", *code))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
