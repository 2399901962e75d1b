"""The two Dockerfiles' build steps, run here (tests/containers/dockerfile.py): a broken COPY or
install line fails CI although no Docker engine runs here. The base images' Python is this
project's .venv (Airflow 3.3 installed), seen from a scratch virtual environment."""

from __future__ import annotations

import filecmp
import json
import os
import re
import subprocess
import sys

from tests.containers.astro_project import ASTRO, PREPARED, prepared_project
from tests.containers.astro_project import RUNTIME_HOME as ASTRO_RUNTIME_HOME  # also its WORKDIR
from tests.containers.compose_stack import DOCKERFILE
from tests.containers.dockerfile import Build, Dockerfile, scratch_venv
from tests.integration_support import REPO

# What the base images set that the steps use.
OFFICIAL_IMAGE_ENV = {"AIRFLOW_HOME": "/opt/airflow"}
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The Airflow each Astro Runtime ships, from Astronomer's runtime catalogue (3.3-7 ships 3.3.1).
RUNTIME_AIRFLOW = {"3.3-8": "3.3.2"}


def _installed_from(venv, module: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}; print({module}.__file__)"],
                          capture_output=True, text=True, check=True, cwd=venv).stdout.strip()


def test_the_official_image_dockerfile_installs_the_provider_from_source(tmp_path):
    dockerfile = Dockerfile.read(DOCKERFILE)
    assert dockerfile.of("FROM") == ["${AIRFLOW_IMAGE}"]
    assert dockerfile.args()["AIRFLOW_IMAGE"] == "apache/airflow:3.3.2-python3.11"
    venv = scratch_venv(tmp_path / "venv")
    build = Build(dockerfile, context=REPO, root=tmp_path / "image", venv=venv, base_env=OFFICIAL_IMAGE_ENV)
    runs = build.replay()
    assert len(runs) == 1
    # Installed from the copied source into the image's Python (not the project's editable install),
    # with the Celery provider, and the named volumes' mount points made.
    assert _installed_from(venv, "airflow_quota_provider").startswith(str(venv)), runs[0].stdout[-2000:]
    # PyTorch from its CPU build's index by default (the CUDA build is docker/compose.gpu.yaml's).
    assert dockerfile.args()["TORCH_BUILD"] == "cpu"
    assert TORCH_CPU_INDEX in runs[0].stdout, runs[0].stdout[:2000]
    assert _installed_from(venv, "airflow.providers.celery")
    for volume in ("config", "checkpoints", "logs"):
        assert build.local(f"/opt/airflow/{volume}").is_dir()


def test_the_astro_dockerfile_installs_the_wheel_prepare_builds_as_root(tmp_path):
    dockerfile = Dockerfile.read(ASTRO / "Dockerfile")
    # Astronomer's documented install of a package from outside an index: as root, then back to astro.
    assert [(s.instruction, s.args) for s in dockerfile.steps if s.instruction in ("USER", "RUN")] == [
        ("USER", "root"), ("RUN", dockerfile.of("RUN")[0]), ("USER", "astro")]
    project = prepared_project(tmp_path / "project")
    venv = scratch_venv(tmp_path / "venv")
    build = Build(dockerfile, context=project, root=tmp_path / "image", venv=venv, workdir=ASTRO_RUNTIME_HOME,
                  base_env={"AIRFLOW_HOME": ASTRO_RUNTIME_HOME})
    # Astro's build (the Runtime image's ONBUILD steps): requirements.txt, then the project copied.
    build.copy("requirements.txt .")
    build.run("pip install --no-cache-dir -r requirements.txt")
    build.copy(". .")
    # Plain Python (setup.py compiles only when asked): the wheel installs on the Runtime's platform too.
    [wheel] = build.local(f"{ASTRO_RUNTIME_HOME}/include/wheels").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    runs = build.replay()
    assert len(runs) == 1
    assert _installed_from(venv, "airflow_quota_provider").startswith(str(venv)), runs[0].stdout[-2000:]
    assert TORCH_CPU_INDEX in runs[0].stdout, runs[0].stdout[:2000]


def test_the_astro_install_resolves_against_the_airflow_and_python_of_the_pinned_runtime(tmp_path):
    """The replay above runs on this project's Airflow; here pip resolves the wheel with the Airflow
    the pinned Runtime ships (the Dockerfile keeps it) for its Python, from PyPI, without installing."""
    image = Dockerfile.read(ASTRO / "Dockerfile").of("FROM")[0]
    pinned = re.fullmatch(r"astrocrpublic\.azurecr\.io/runtime:(\d+\.\d+-\d+)-python-(3\.\d+)", image)
    assert pinned, f"{image}: pin a Runtime and its Python"
    runtime, python = pinned.groups()
    assert runtime in RUNTIME_AIRFLOW, f"Runtime {runtime}: add the Airflow it ships to RUNTIME_AIRFLOW"
    [wheel] = prepared_project(tmp_path / "project").glob("include/wheels/*.whl")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--only-binary=:all:", "--python-version", python, "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux2014_x86_64", f"apache-airflow=={RUNTIME_AIRFLOW[runtime]}", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert resolved["apache-airflow"] == RUNTIME_AIRFLOW[runtime]
    assert resolved["airflow-quota-provider"] == wheel.name.split("-")[1]


def test_the_astro_project_keeps_no_copy_of_the_repository_s_files_in_git(tmp_path):
    """The DAGs, the quota file and the wheel exist once, in the repository: ./prepare copies them
    into the project, git ignores the copies, and the copies are the repository's files."""
    tracked = subprocess.run(["git", "ls-files", "dags", "include"], cwd=ASTRO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked == ["dags/.airflowignore"]
    project = prepared_project(tmp_path / "project")
    for name in ("quota_team_a_finetune.py", "quota_team_a_pretrain.py", "quota_team_b_sweep.py", "quota_inference_eval.py",
                 "scripts/train_mlp.py"):
        assert filecmp.cmp(project / "dags" / name, REPO / "dags" / name, shallow=False), name
    assert filecmp.cmp(project / "include" / "quotas.yaml", REPO / "examples" / "quotas.yaml", shallow=False)
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "dags/quota_team_b_sweep.py", *PREPARED],
                             cwd=ASTRO, capture_output=True, text=True).stdout.split()
    assert ignored == ["dags/quota_team_b_sweep.py", *PREPARED]


def test_astro_dev_pytest_s_test_passes_on_the_prepared_project(tmp_path):
    """tests/dags/test_dag_example.py as `astro dev pytest` runs it: in the project, its DAGs folder
    Airflow's, the AWS Batch example left out by dags/.airflowignore."""
    project = prepared_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path / "home"), AIRFLOW__CORE__DAGS_FOLDER=str(project / "dags"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/dags"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
