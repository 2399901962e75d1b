"""docker/compose.yaml without Docker: every service's command as a local process.

The file is read the way Docker reads it (``docker-compose config``: anchors merged, variables
interpolated, relative paths made absolute), then each Airflow service runs here with exactly its
``environment``, ``entrypoint`` and ``command`` (through the official image's entrypoint rule: a
command that is not ``bash``, ``python`` or ``airflow`` is an ``airflow`` subcommand), in the
service's own directory standing for its container's filesystem. What differs from containers:

- **hosts**: ``postgres`` and ``redis`` are this machine's PostgreSQL (a fresh database, user
  ``postgres``, trust auth) and Redis (a Redis database of its own). A URL naming them must carry
  the credentials, database and port the file gives those services, or the stack refuses to start.
  A URL naming another service goes to 127.0.0.1 and that service's local port.
- **ports**: containers may all listen on 8080, 8793, 8794 and 8974; here each service gets ports
  of its own for the settings that choose them (``LISTEN``), and ``localhost:PORT`` in its
  healthcheck and a ``service:PORT`` in any URL are rewritten to match.
- **filesystem**: a container path under the image's directories (``CONTAINER_ROOTS``) or a
  volume's target becomes the same path under the service's directory; each volume target there is
  a symbolic link to the volume (one directory per named volume, shared by the services that mount
  it) or to the bind mount's source. A variable that names a path no volume backs therefore lands
  in that one service's private directory, as it would in its container.
- ``depends_on`` is honoured in order: ``service_completed_successfully`` waits for a zero exit,
  ``service_healthy`` runs the service's own healthcheck until it passes.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import yaml

from airflow_quota_provider.executors.local_launcher import kill_tree
from tests.integration_support import REPO, VENV_BIN, AirflowInstance, free_port, port_shift, provider_shim, wait_for

COMPOSE_FILE = REPO / "docker" / "compose.yaml"
GPU_OVERRIDE = REPO / "docker" / "compose.gpu.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"

# The official apache/airflow image's ENV that the services rely on (docker/Dockerfile adds none).
IMAGE_ENV = {"AIRFLOW_HOME": "/opt/airflow", "HOME": "/home/airflow"}
CONTAINER_ROOTS = ("/opt/airflow", "/home/airflow")
# Services this machine provides instead of containers.
LOCAL_SERVICES = ("postgres", "redis")
# Settings that choose a port an Airflow service listens on, with Airflow's defaults.
LISTEN = {
    "AIRFLOW__API__PORT": 8080,
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": 8793,
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": 8794,
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": 8974,
}
_URL = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?:(?P<user>[^:@/\s'\"]*)(?::(?P<password>[^@/\s'\"]*))?@)?"
    r"(?P<host>[A-Za-z0-9_.-]+)(?::(?P<port>\d+))?(?P<path>/[^\s'\"]*)?"
)
_HOST_PORT = re.compile(r"(?<![\w.-])(?P<host>localhost|127\.0\.0\.1):(?P<port>\d+)")
_PATH = re.compile(r"(?<![\w.:/@-])/[\w.@+/-]*")


def compose_config(*files: Path) -> dict:
    """The compose files as Docker Compose resolves them, with only the files' own defaults."""
    if not shutil.which("docker-compose"):
        raise AssertionError("docker-compose is missing: scripts/test installs Debian's docker-compose package")
    args = [a for f in files for a in ("-f", str(f))]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["docker-compose", *args, "config"], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"docker-compose config failed:\n{out.stderr}")
    return yaml.safe_load(out.stdout)


def _unescape(value) -> str:
    """Compose's ``$$`` is a literal ``$`` in the container."""
    return str(value).replace("$$", "$")


def _argv(value) -> list[str]:
    if value is None:
        return []
    return shlex.split(_unescape(value)) if isinstance(value, str) else [_unescape(v) for v in value]


def _seconds(value: str | None, default: float) -> float:
    if not value:
        return default
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(value)):
        total += float(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


class ComposeStack(AirflowInstance):
    """The services of a resolved compose file as local processes; the REST/SQL helpers of
    :class:`AirflowInstance` work on it (the api-server's port, the fresh PostgreSQL database)."""

    def __init__(self, home: Path, config: dict, *, database: str, redis_db: int, skip: tuple[str, ...] = (),
                 host_env: dict[str, str] | None = None) -> None:
        """``skip``: services not to start; ``host_env``: variables of this machine for every service
        (below the file's own)."""
        self.config = config
        self.host_env = host_env or {}
        self.services = {name: svc for name, svc in config["services"].items() if name not in skip}
        self.database = database
        self.redis_db = redis_db
        self.volumes_dir = home / "volumes"
        self.ports: dict[tuple[str, int], int] = {}
        self._next_port = 18700
        for name in self.airflow_services():
            container_env = self.container_env(name)
            for var, default in LISTEN.items():
                self.ports[(name, int(container_env.get(var, default)))] = self._free_port()
        api = next(n for n in self.airflow_services() if _argv(self.services[n].get("command"))[:1] == ["api-server"])
        super().__init__(
            home,
            port=self.ports[(api, int(self.container_env(api).get("AIRFLOW__API__PORT", 8080)))],
            quota_file="",
            dags_folder=home,
            database_url=f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
        )
        self.api_service = api
        self.env = self.service_env(api)  # for airflow(): the CLI as the api-server's container runs it
        self._healthy: set[str] = set()
        self._health: dict[str, concurrent.futures.Future] = {}

    # ------------------------------------------------------------------------- the file, here

    def airflow_services(self) -> list[str]:
        return [n for n in self.services if n not in LOCAL_SERVICES]

    def container_env(self, name: str) -> dict[str, str]:
        env = self.services[name].get("environment") or {}
        return {**IMAGE_ENV, **{k: _unescape(v) for k, v in env.items() if v is not None}}

    def _free_port(self) -> int:
        port = free_port(self._next_port, 18999)
        self._next_port = port + 1 - port_shift()  # the range free_port shifts, past this port
        return port

    def root(self, name: str) -> Path:
        """The service's container filesystem: volume targets are links to the volumes."""
        root = self.home / "containers" / name
        if root.exists():
            return root
        for base in CONTAINER_ROOTS:
            (root / base.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for volume in self.services[name].get("volumes") or []:
            source, target = self._volume(volume)
            link = root / target.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_dir() and not link.is_symlink():
                link.rmdir()
            link.symlink_to(source)
        return root

    def _volume(self, volume) -> tuple[Path, str]:
        if isinstance(volume, dict):
            source, target = volume.get("source"), volume["target"]
        else:
            parts = volume.split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
        if source is None or not source.startswith("/"):  # a named (or anonymous) volume
            path = self.volumes_dir / (source or f"anonymous{target.replace('/', '_')}")
            path.mkdir(parents=True, exist_ok=True)
            return path, target
        if not Path(source).exists():
            raise AssertionError(f"volume {volume!r}: {source} does not exist")
        return Path(source), target

    def _targets(self, name: str) -> list[str]:
        return [self._volume(v)[1] for v in self.services[name].get("volumes") or []]

    def localize(self, name: str, text: str) -> str:
        """A string of service ``name``'s container, as it must read here."""
        text = _URL.sub(lambda m: self._url(name, m), text)
        text = _HOST_PORT.sub(lambda m: f"127.0.0.1:{self.ports.get((name, int(m['port'])), int(m['port']))}", text)
        roots = CONTAINER_ROOTS + tuple(self._targets(name))

        def path(m: re.Match) -> str:
            p = m.group(0)
            if any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots):
                return str(self.root(name)) + p
            return p

        return _PATH.sub(path, text)

    def _url(self, name: str, m: re.Match) -> str:
        host, port, path = m["host"], m["port"], m["path"] or ""
        if host == "postgres":
            pg = self.container_env("postgres")
            want = (pg.get("POSTGRES_USER"), pg.get("POSTGRES_PASSWORD"), f"/{pg.get('POSTGRES_DB')}", "5432")
            got = (m["user"], m["password"], path, port or "5432")
            if got != want:
                raise AssertionError(f"{name}: {m.group(0)} does not match the postgres service (user, password, database, port) {want}")
            return f"{m['scheme']}://postgres@127.0.0.1:5432/{self.database}"
        if host == "redis":
            if (port or "6379") != "6379" or not re.fullmatch(r"(/\d+)?", path):
                raise AssertionError(f"{name}: {m.group(0)} is not the redis service's port 6379 and a database number")
            return f"{m['scheme']}://127.0.0.1:6379/{self.redis_db}"
        target = next((s for s, svc in self.services.items() if host in (s, svc.get("hostname"))), None)
        if target is None:
            return m.group(0)
        default = {"http": 80, "https": 443}.get(m["scheme"])
        key = (target, int(port) if port else default)
        if key not in self.ports:
            listening = sorted(p for (s, p) in self.ports if s == target)
            raise AssertionError(f"{name}: {m.group(0)} names port {key[1]} of {target}, which listens on {listening}")
        return f"{m['scheme']}://127.0.0.1:{self.ports[key]}{path}"

    def service_env(self, name: str) -> dict[str, str]:
        svc = self.services[name]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(self.host_env)
        env.update({
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(provider_shim(self.home / "site")),
            "HOSTNAME": svc.get("hostname") or socket.gethostname(),
            "PYTHONUNBUFFERED": "1",
        })
        container_env = self.container_env(name)
        for key, value in container_env.items():
            env[key] = self.localize(name, value)
        for var, default in LISTEN.items():
            env[var] = str(self.ports[(name, int(container_env.get(var, default)))])
        for key in ("AIRFLOW_HOME", "HOME"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        return env

    def argv(self, name: str) -> list[str]:
        """The entrypoint and command, through the official image's entrypoint when not overridden."""
        svc = self.services[name]
        command = _argv(svc.get("command"))
        if svc.get("entrypoint") is not None:
            argv = _argv(svc["entrypoint"]) + command
        elif command[:1] in (["bash"], ["python"], ["airflow"]):
            argv = command
        else:
            argv = ["airflow", *command]
        return [self.localize(name, a) for a in argv]

    # ---------------------------------------------------------------------------- processes

    def start(self) -> ComposeStack:
        """Start every service after what it depends on; the healthchecks of those that nothing
        waited for run meanwhile in the background (``assert_healthy`` waits for them)."""
        for name in self._order():
            self._satisfy(name)
            self._start_service(name)
        pending = [n for n in self.airflow_services() if n not in self._healthy and self.healthcheck(n) is not None]
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(pending)))
        self._health = {name: self._pool.submit(self.wait_healthy, name) for name in pending}
        return self

    def assert_healthy(self) -> None:
        """Every service with a healthcheck passed it (the init service has none: it has exited)."""
        for future in self._health.values():
            future.result()

    def _order(self) -> list[str]:
        order: list[str] = []

        def visit(name: str, path: tuple[str, ...] = ()) -> None:
            if name in order or name in LOCAL_SERVICES:
                return
            if name in path:
                raise AssertionError(f"depends_on cycle: {' -> '.join(path + (name,))}")
            for dep in self.services[name].get("depends_on") or {}:
                if dep not in self.services:
                    raise AssertionError(f"{name} depends on {dep}, which is no service")
                visit(dep, path + (name,))
            order.append(name)

        for name in self.services:
            visit(name)
        return order

    def _satisfy(self, name: str) -> None:
        deps = self.services[name].get("depends_on") or {}
        for dep, spec in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            if dep in LOCAL_SERVICES:
                continue  # this machine's PostgreSQL and Redis answer (scripts/services)
            condition = (spec or {}).get("condition", "service_started")
            if condition == "service_completed_successfully":
                proc = self.procs[dep]
                try:
                    code = proc.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{dep} did not complete:\n{self.tail(dep)}") from None
                assert code == 0, f"{dep} exited with {code}; {name} needs it to succeed:\n{self.tail(dep)}"
            elif condition == "service_healthy":
                self.wait_healthy(dep)

    def _start_service(self, name: str) -> None:
        log = open(self.home / f"{name}.log", "ab")
        env = self.service_env(name)
        self.procs[name] = subprocess.Popen(
            self.argv(name), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=env["AIRFLOW_HOME"],
            start_new_session=True,
        )

    def healthcheck(self, name: str) -> list[str] | None:
        test = (self.services[name].get("healthcheck") or {}).get("test")
        if not test or test[0] == "NONE":
            return None
        kind, *rest = _argv(test) if isinstance(test, list) else ["CMD-SHELL", _unescape(test)]
        argv = ["/bin/sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest
        return [self.localize(name, a) for a in argv]

    def wait_healthy(self, name: str, timeout: float = 240) -> None:
        """Run the service's healthcheck until it passes (a service without one: until it runs)."""
        if name in self._healthy:
            return
        argv = self.healthcheck(name)
        spec = self.services[name].get("healthcheck") or {}
        check_timeout = _seconds(spec.get("timeout"), 30)

        def healthy() -> bool:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited ({proc.returncode}):\n{self.tail(name)}")
            if argv is None:
                return True
            try:
                return subprocess.run(argv, env=self.service_env(name), capture_output=True,
                                      timeout=check_timeout).returncode == 0
            except subprocess.TimeoutExpired:
                return False

        wait_for(healthy, f"{name}'s healthcheck {argv}", timeout=timeout, interval=2,
                 on_timeout=lambda: self.tail(name))
        self._healthy.add(name)

    def stop(self) -> None:
        if self._health:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._stop_processes()

    def _stop_processes(self) -> None:
        """SIGTERM to each service's process group, then SIGKILL to whatever of its tree is left
        (task processes may run in sessions of their own)."""
        trees = {name: _tree(proc.pid) for name, proc in self.procs.items()}
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for name, proc in self.procs.items():
            kill_tree(proc.pid)
            _signal_group(proc.pid, signal.SIGKILL)
            for pid in trees[name]:
                _signal_group(pid, signal.SIGKILL)
        self.procs.clear()

    def login(self, username: str, password: str) -> None:
        """A JWT from the api-server for the REST helpers (the file's admin user, not all-admins)."""
        import json
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/auth/token",
            data=json.dumps({"username": username, "password": password}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.token = json.loads(resp.read())["access_token"]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now."""
    tree, index = [pid], 0
    while index < len(tree):
        try:
            with open(f"/proc/{tree[index]}/task/{tree[index]}/children") as f:
                tree.extend(int(child) for child in f.read().split())
        except OSError:
            pass
        index += 1
    return tree


def _signal_group(pid: int, sig: int) -> None:
    for send in (os.killpg, os.kill):
        try:
            send(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
