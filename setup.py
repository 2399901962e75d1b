"""Compile the policy's and the simulator's hot modules with Cython, where a C compiler is at hand.

The modules are compiled from their unchanged Python source: no Cython types (``annotation_typing``
is off, so an ``int`` or ``float`` annotation stays a Python object), and a ``.pxd`` beside a module
only declares its hot classes' attributes, which makes those classes extension types whose
``self.x`` is a field, not a dictionary lookup (they take no attribute beyond those, as their
``__slots__`` or ``__init__`` already say). ``tests/policy/test_compiled.py`` checks that compiled
and plain replays decide the same; docs/simulation.md ("Replay time") has the figures. Everything
else about the package is in pyproject.toml. Without Cython or a compiler the build warns and the
package stays plain Python; ``AIRFLOW_QUOTA_PURE_PYTHON=1`` asks for plain Python outright (a wheel
that installs on any platform, as docker/astro/ takes).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Where a replay spends its time. Not documents.py: PyYAML's representer tells a generator by
# types.GeneratorType, which a compiled generator is not.
COMPILED = [
    *(
        f"airflow_quota_provider/policy/{name}.py"
        for name in (
            "accounting",
            "backlog",
            "candidates",
            "capacity",
            "cycle",
            "decision",
            "ordering",
            "placement",
            "preemption",
            "preemption_policy",
            "reasons",
            "running",
            "state",
        )
    ),
    "airflow_quota_provider/simulation/engine.py",
    "airflow_quota_provider/simulation/forecast.py",
]


class OptionalBuildExt(build_ext):
    """A failed compile leaves the package as plain Python, with a warning, not a failed install."""

    def initialize_options(self):
        super().initialize_options()
        self.parallel = os.cpu_count() or 1

    def run(self):
        try:
            super().run()
        except Exception as error:  # any compiler or linker failure: the .py files still work
            _fallback(f"compiling failed ({error})", "what did not compile runs")


def _fallback(why: str, what: str = "the policy runs") -> None:
    print(f"airflow-quota-provider: {why}; {what} as plain Python (slower replays)", file=sys.stderr)


def _extensions() -> list:
    if os.environ.get("AIRFLOW_QUOTA_PURE_PYTHON") == "1":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _fallback("Cython is not installed")
        return []
    return cythonize(
        COMPILED,
        nthreads=os.cpu_count() or 1,
        compiler_directives={"language_level": 3, "annotation_typing": False},
        quiet=True,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
