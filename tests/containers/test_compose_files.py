"""The compose files as Docker Compose reads them (Debian's docker-compose, `config`): both are
accepted, and they hold what the fleet needs. What the services do is run in
test_compose_stack.py; here, what a local run cannot show (GPU reservations, the Astro CLI's merge)
and the fleet's shape."""

from __future__ import annotations

import re
import subprocess

from tests.containers.compose_stack import COMPOSE_FILE, GPU_OVERRIDE, compose_config
from tests.integration_support import REPO

from airflow_quota_provider.policy import Quota, load_quota_file

ASTRO_OVERRIDE = REPO / "docker" / "astro" / "docker-compose.override.yml"
ASTRO_CLI_STAND_IN = REPO / "tests" / "containers" / "astro_cli_compose.yaml"
QUOTA_EXECUTOR = "quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor"


def _config_q(*files) -> subprocess.CompletedProcess:
    args = [a for f in files for a in ("-f", str(f))]
    return subprocess.run(["docker-compose", *args, "config", "-q"], capture_output=True, text=True, timeout=120)


def test_docker_compose_accepts_the_compose_file_and_its_gpu_override():
    for files in ((COMPOSE_FILE,), (COMPOSE_FILE, GPU_OVERRIDE)):
        result = _config_q(*files)
        assert result.returncode == 0, result.stderr


def test_docker_compose_accepts_the_astro_override_on_astro_s_own_compose_file():
    result = _config_q(ASTRO_CLI_STAND_IN, ASTRO_OVERRIDE)
    assert result.returncode == 0, result.stderr
    services = compose_config(ASTRO_CLI_STAND_IN, ASTRO_OVERRIDE)["services"]
    for name in ("scheduler", "dag-processor", "api-server", "triggerer"):
        assert services[name]["environment"]["AIRFLOW__CORE__EXECUTOR"] == QUOTA_EXECUTOR, name  # not LocalExecutor


def test_the_fleet_has_two_schedulers_two_gpu_hosts_and_a_shared_checkpoint_volume():
    services = compose_config(COMPOSE_FILE)["services"]
    first, second = services["airflow-scheduler"], services["airflow-scheduler-2"]
    for key in ("command", "environment", "volumes", "healthcheck", "depends_on", "image"):
        assert first[key] == second[key], key
    hosts = {n: s for n, s in services.items() if "quota worker" in str(s.get("command"))}
    assert sorted(hosts) == ["gpu-host-1", "gpu-host-2"]
    for name, host in hosts.items():
        assert any(v.startswith("checkpoints:") for v in host["volumes"]), name
        assert "deploy" not in host, "virtual GPUs by default"
    for name, svc in services.items():
        assert "healthcheck" in svc or name == "airflow-init", name


def test_the_gpu_override_reserves_distinct_nvidia_gpus_for_each_host():
    services = compose_config(COMPOSE_FILE, GPU_OVERRIDE)["services"]
    reserved = {}
    for name in ("gpu-host-1", "gpu-host-2"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], device
        reserved[name] = set(device["device_ids"])
    assert not reserved["gpu-host-1"] & reserved["gpu-host-2"], reserved


def test_gpu_hosts_on_nvidia_gpus_run_an_image_with_pytorch_s_cuda_build():
    """docker/Dockerfile installs PyTorch's CPU build unless TORCH_BUILD=cuda: the GPU override
    builds the GPU hosts so, under a tag of their own; the base file's services keep the CPU build."""
    base = compose_config(COMPOSE_FILE)["services"]
    gpu = compose_config(COMPOSE_FILE, GPU_OVERRIDE)["services"]
    assert all("args" not in svc.get("build", {}) for svc in base.values())
    for name in ("gpu-host-1", "gpu-host-2"):
        assert gpu[name]["build"]["args"] == {"TORCH_BUILD": "cuda"}, name
        assert gpu[name]["image"] != gpu["airflow-scheduler"]["image"], name


def test_gpu_hosts_let_their_tasks_checkpoint_before_docker_compose_stop_kills_them():
    """`docker compose stop` sends SIGTERM, then SIGKILL after stop_grace_period: it must outlast the
    longest grace period a task gets (the quotas' default or the mounted quota file's), plus margin;
    dumb-init passes the signal to the worker alone, as Airflow's official file sets for Celery workers."""
    quotas = load_quota_file(REPO / "examples" / "quotas.yaml").queues[0].quotas
    longest = max(Quota.grace_period_s, *(q.grace_period_s for q in quotas))
    services = compose_config(COMPOSE_FILE, GPU_OVERRIDE)["services"]
    for name in ("gpu-host-1", "gpu-host-2"):
        host = services[name]
        assert re.fullmatch(r"\d+s", host["stop_grace_period"]), host["stop_grace_period"]
        assert int(host["stop_grace_period"][:-1]) >= longest + 20, (name, host["stop_grace_period"], longest)
        assert host["environment"]["DUMB_INIT_SETSID"] == "0", name


def test_the_init_service_gives_the_writable_volumes_to_the_services_user_as_root():
    """As in Airflow's official file: the init service runs as root and chowns every named volume the
    services write to the user they run as; the read-only bind mounts are left alone."""
    services = compose_config(COMPOSE_FILE)["services"]
    init = services["airflow-init"]
    assert init["user"] == "0:0"
    uid = services["airflow-scheduler"]["user"].split(":")[0]
    chowned = re.search(rf'chown -R "{uid}:0" /opt/airflow/\{{([\w,]+)\}}', init["command"][-1])
    assert chowned, init["command"][-1]
    writable = {v.split(":")[1] for v in init["volumes"] if not v.startswith("/")}
    assert {f"/opt/airflow/{d}" for d in chowned[1].split(",")} == writable
