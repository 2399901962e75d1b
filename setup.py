"""The package is pure Python; ``AIRFLOW_QUOTA_COMPILE=1`` compiles the policy's and the simulator's hot
modules with Cython, an option for release wheels and benchmarks (as mypy and Black use mypyc).

A checkout runs its source: an edit runs at once, under a debugger, coverage or a tracing profiler.
``scripts/build-compiled DIR`` makes a compiled copy of the package outside the source tree (put DIR
first on ``PYTHONPATH`` to run it); ``tests/policy/test_compiled.py`` checks that it decides exactly as
the source does, and ``benchmarks/simulate.py`` times both. A wheel: ``AIRFLOW_QUOTA_COMPILE=1 pip
wheel --no-build-isolation .`` with Cython and a C compiler installed.

The modules are compiled from their unchanged Python source: no Cython types (``annotation_typing`` is
off, so an ``int`` or ``float`` annotation stays a Python object), and a ``.pxd`` beside a module only
declares its hot classes' attributes, which makes those classes extension types whose ``self.x`` is a
field, not a dictionary lookup (they take no attribute beyond those, as their ``__slots__`` or
``__init__`` already say). Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import os

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


class ParallelBuildExt(build_ext):
    def initialize_options(self):
        super().initialize_options()
        self.parallel = os.cpu_count() or 1


def _extensions() -> list:
    if os.environ.get("AIRFLOW_QUOTA_COMPILE") != "1":
        return []
    from Cython.Build import cythonize  # asked for: a missing Cython is an error, not a silent plain build

    return cythonize(
        COMPILED,
        build_dir="build/cython",  # the generated C stays out of the package
        nthreads=os.cpu_count() or 1,
        compiler_directives={"language_level": 3, "annotation_typing": False},
        quiet=True,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": ParallelBuildExt})
