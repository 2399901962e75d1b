"""The two Dockerfiles' build steps, run here (tests/containers/dockerfile.py): a broken COPY or
install line fails CI although no Docker engine runs here. The base images' Python is this
project's .venv (Airflow 3.3 installed), seen from a scratch virtual environment."""

from __future__ import annotations

import filecmp
import subprocess

from tests.containers.compose_stack import DOCKERFILE
from tests.containers.dockerfile import Build, Dockerfile, scratch_venv
from tests.integration_support import REPO

ASTRO = REPO / "docker" / "astro"
# What the base images set that the steps use.
OFFICIAL_IMAGE_ENV = {"AIRFLOW_HOME": "/opt/airflow"}
ASTRO_RUNTIME_HOME = "/usr/local/airflow"  # the Runtime's AIRFLOW_HOME and WORKDIR
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


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


def test_the_astro_dockerfile_installs_the_wheel_the_readme_command_builds(tmp_path):
    dockerfile = Dockerfile.read(ASTRO / "Dockerfile")
    assert dockerfile.of("FROM") == ["astrocrpublic.azurecr.io/runtime:3.3-1"]
    venv = scratch_venv(tmp_path / "venv")
    build = Build(dockerfile, context=ASTRO, root=tmp_path / "image", venv=venv, workdir=ASTRO_RUNTIME_HOME,
                  base_env={"AIRFLOW_HOME": ASTRO_RUNTIME_HOME})
    # Astro's build (the Runtime image's ONBUILD steps): requirements.txt, then the project copied.
    build.copy("requirements.txt .")
    build.run("pip install --no-cache-dir -r requirements.txt")
    build.copy(". .")
    # The README's command, run from the repository root: the wheel into the project's include/wheels.
    wheels = build.local(f"{ASTRO_RUNTIME_HOME}/include/wheels")
    subprocess.run([str(venv / "bin" / "pip"), "wheel", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
                   check=True, capture_output=True, cwd=REPO)
    # Plain Python (setup.py compiles only when asked): the wheel installs on the Runtime's platform too.
    [wheel] = wheels.glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    runs = build.replay()
    assert len(runs) == 1
    assert _installed_from(venv, "airflow_quota_provider").startswith(str(venv)), runs[0].stdout[-2000:]


def test_the_astro_project_carries_the_example_dags_and_quota_file_unchanged():
    """docker/astro/dags and include/quotas.yaml are copies (the Astro build context is
    docker/astro): refresh them when the examples change."""
    for name in ("quota_team_a_finetune.py", "quota_team_b_sweep.py", "quota_inference_eval.py", "scripts/train_mlp.py"):
        assert filecmp.cmp(ASTRO / "dags" / name, REPO / "dags" / name, shallow=False), f"cp dags/{name} docker/astro/dags/{name}"
    assert filecmp.cmp(ASTRO / "include" / "quotas.yaml", REPO / "examples" / "quotas.yaml", shallow=False), \
        "cp examples/quotas.yaml docker/astro/include/quotas.yaml"
