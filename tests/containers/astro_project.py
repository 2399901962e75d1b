"""The Astro project as `astro dev start` builds it: a copy of docker/astro filled by its ./prepare
(the wheel, the example DAGs, the quota file, the PyTorch index file), so tests never write into the
working tree; and the environment its Dockerfile and docker-compose.override.yml give a service."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.containers.dockerfile import Dockerfile
from tests.integration_support import REPO

ASTRO = REPO / "docker" / "astro"
RUNTIME_HOME = "/usr/local/airflow"  # where Astro puts the project in its image
# What ./prepare writes (docker/astro/.gitignore keeps it out of git).
PREPARED = ("include/wheels", "include/quotas.yaml", "include/torch-cpu.txt")


def prepared_project(dest: Path) -> Path:
    """A copy of the project's committed files, then ./prepare run on it with this Python."""
    tracked = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=ASTRO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ASTRO / name, dest / name)
    subprocess.run([str(ASTRO / "prepare"), str(dest)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    return dest


def astro_environment(project: Path, service: str = "scheduler") -> dict[str, str]:
    """Dockerfile ENV, then the override's environment for ``service`` (compose wins over ENV), with
    the Runtime's paths read in ``project``."""
    override = yaml.safe_load((project / "docker-compose.override.yml").read_text())
    env = {**Dockerfile.read(project / "Dockerfile").env(), **override["services"][service]["environment"]}
    return {k: str(v).replace(RUNTIME_HOME, str(project)) for k, v in env.items()}
