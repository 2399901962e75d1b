"""Refuse compiled policy modules older than their source, in a checkout.

``setup.py`` compiles the hot modules in place (``.so`` beside ``.py``) and Python prefers the
``.so``: after an edit to a ``.py`` the old compiled module would silently run instead. Installed
packages are not checked (no ``setup.py`` above them), only a checkout, where ``scripts/bootstrap``
recompiles. ``python -m airflow_quota_provider._compiled`` exits 1 when something is stale.
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

_COMMAND = "python setup.py build_ext --inplace"


def stale(directory: str | Path) -> list[Path]:
    """The ``.py`` files (and the ``.pxd`` files declaring their classes for Cython) in ``directory``
    newer than their compiled module, in a checkout."""
    directory = Path(directory)
    if not (directory.parents[1] / "setup.py").is_file():
        return []
    found = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for compiled in directory.glob(f"*{suffix}"):
            built = compiled.stat().st_mtime
            for extension in (".py", ".pxd"):
                source = compiled.with_name(compiled.name[: -len(suffix)] + extension)
                if source.is_file() and source.stat().st_mtime > built:
                    found.append(source)
    return sorted(found)


def check(directory: str | Path) -> None:
    """Raise ImportError naming the stale sources, and the command that recompiles them."""
    if found := stale(directory):
        names = ", ".join(path.name for path in found)
        raise ImportError(
            f"{names} in {Path(directory)} changed since it was compiled: run `{_COMMAND}` in "
            f"{Path(directory).parents[1]} (or set AIRFLOW_QUOTA_PURE_PYTHON=1 and delete the .so files)"
        )


def _main() -> int:
    package = Path(__file__).parent
    found = stale(package / "policy") + stale(package / "simulation")
    for path in found:
        print(f"stale compiled module: {path}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(_main())
