"""The compose files as Docker Compose reads them (Debian's docker-compose, `config`): both are
accepted, and they hold what the fleet needs. What the services do is run in
test_compose_stack.py; here, what a local run cannot show (GPU reservations, the Astro CLI's merge)
and the fleet's shape."""

from __future__ import annotations

import subprocess

from tests.containers.compose_stack import COMPOSE_FILE, GPU_OVERRIDE, compose_config
from tests.integration_support import REPO

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
