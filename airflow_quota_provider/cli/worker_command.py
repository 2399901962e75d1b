"""``airflow quota worker``: one GPU host of the fleet.

It registers the host (name, job queue, GPU indexes and their type) in ``quota_host``, heartbeats every
``[quota] host_heartbeat_s``, and runs ``airflow celery worker`` on the host's own Celery queue with
the quota task and its remote-control commands loaded (:mod:`airflow_quota_provider.executors.celery_worker`).

Every launch dies with the worker (:mod:`airflow_quota_provider.executors.containment`). Before the
host's GPUs are handed out, at start and when it rejoins after it was lost, the worker ends whatever
of its launches still runs (recorded in its job directories) and waits until none does: the
scheduler gave those launches up and runs their jobs elsewhere.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading

from airflow.cli.cli_config import ActionCommand, Arg, lazy_load_command

log = logging.getLogger(__name__)

ARG_QUEUES = Arg(("--queues",), help="The job queue (of the quota file) this host serves", required=True)
ARG_DEVICES = Arg(("--devices",), help="Comma-separated GPU indexes to hand out (default: nvidia-smi, else --virtual-gpus)")
ARG_VIRTUAL_GPUS = Arg(
    ("--virtual-gpus",), type=int, help="Virtual GPUs (indexes 0..N-1) when there is neither --devices nor nvidia-smi"
)
ARG_GPU_TYPE = Arg(
    ("--gpu-type",),
    help="This host's GPU type, one of its job queue's types (required with --virtual-gpus on a queue with GPU "
    "types; default: nvidia-smi's model name, 'NVIDIA H100 80GB HBM3' is h100)",
)
ARG_HOSTNAME = Arg(("--hostname",), help="The host's name in the fleet (default: this machine's hostname)")
ARG_ADDRESS = Arg(
    ("--address",),
    help="Where the other hosts of a multi-host job reach this one (its MASTER_ADDR when it runs node 0; "
    "default: this machine's hostname resolved)",
)
ARG_CONCURRENCY = Arg(
    ("--concurrency",), type=int,
    help="Celery pool processes (default: two per GPU, so that a supervisor still finishing does not hold up the next task)",
)
ARG_SKIP_SERVE_LOGS = Arg(("--skip-serve-logs",), action="store_true", help="Do not serve task logs from this host")

WORKER_COMMAND = ActionCommand(
    name="worker",
    help="Run a GPU host of the fleet: register its GPUs, heartbeat, and run quota tasks through Celery",
    func=lazy_load_command("airflow_quota_provider.cli.worker_command.worker"),
    args=(ARG_QUEUES, ARG_DEVICES, ARG_VIRTUAL_GPUS, ARG_GPU_TYPE, ARG_HOSTNAME, ARG_ADDRESS, ARG_CONCURRENCY, ARG_SKIP_SERVE_LOGS),
)


def _job_queue(queues: str) -> tuple[str, tuple[str, ...] | None]:
    """The one job queue named by ``--queues`` and its GPU types, checked against the quota file
    when one is set (None: no quota file here to say)."""
    from airflow.configuration import conf
    from airflow_quota_provider.quota_file import QuotaConfigError, read_quota_file

    names = [q.strip() for q in queues.split(",") if q.strip()]
    if len(names) != 1:
        raise SystemExit(f"Error: --queues: {queues!r}: a GPU host serves exactly one job queue")
    path = conf.get("quota", "quota_file", fallback="")
    if not path:
        return names[0], None
    try:
        known = {q.name: tuple(t.name for t in q.types) for q in read_quota_file(path).queues}
    except QuotaConfigError as e:
        raise SystemExit(f"Error: {e}")
    if names[0] not in known:
        raise SystemExit(f"Error: --queues: {names[0]!r} is not one of {', '.join(known)} (quota file {path})")
    return names[0], known[names[0]]


def _gpu_type(given: str | None, queue: str, types: tuple[str, ...] | None, devices: list[str], source: str) -> str | None:
    """The host's GPU type: ``--gpu-type``, else nvidia-smi's model of ``devices`` (virtual GPUs have
    none). A job queue with GPU ``types`` needs one of them; an untyped queue takes no ``--gpu-type``
    (nvidia-smi's type is recorded all the same, and GPUs of several types serve it untyped). ``types``
    None: no quota file to check against."""
    from airflow_quota_provider.executors.config import VIRTUAL_GPUS, machine_gpu_type, nvidia_smi_gpus
    from airflow_quota_provider.protocol import GPU_TYPE_NAME

    if given is not None:
        if not GPU_TYPE_NAME.match(given):
            raise SystemExit(f"Error: --gpu-type: {given!r} is not a GPU type name (letters, digits, '.', '-', '_', at most 64)")
        if types == ():
            raise SystemExit(f"Error: --gpu-type: job queue {queue} has no GPU types (its capacity is a number of GPUs)")
        if types and given not in types:
            raise SystemExit(f"Error: --gpu-type: {given!r} is not one of job queue {queue}'s GPU types {', '.join(types)}")
        return given
    models = {} if source == VIRTUAL_GPUS else nvidia_smi_gpus()
    try:
        found = machine_gpu_type(devices, models)
    except ValueError as e:
        if types != ():
            raise SystemExit(f"Error: {e}")
        log.warning("Job queue %s has no GPU types, so this host serves it untyped: %s", queue, e)
        return None
    if found is None and types != ():
        why = "virtual GPUs have none" if source == VIRTUAL_GPUS else "nvidia-smi does not say"
        if types is None:  # the scheduler logs it too, once the host serves a typed queue
            log.warning(
                "This host's GPU type is unknown (%s) and there is no quota file here ([quota] quota_file) to check "
                "job queue %s against: if it has GPU types, this host's GPUs count for none of them and no job "
                "starts here; pass --gpu-type", why, queue,
            )
            return None
        raise SystemExit(
            f"Error: --gpu-type is required: job queue {queue} has GPU types {', '.join(types)} and this host's "
            f"type is unknown ({why})"
        )
    if types and found not in types:
        named = ", ".join(sorted({models[d] for d in devices if d in models}))
        raise SystemExit(
            f"Error: this host's GPUs are {found} ({named}, by nvidia-smi), not one of job queue {queue}'s GPU types "
            f"{', '.join(types)}; pass --gpu-type to name them as the quota file does"
        )
    return found


HOST_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")
"""A host's name: a DNS name's characters. It becomes a Celery queue, a folder of the state directory,
and words in logs, pending reasons and the UI (no separator, no control character)."""


def _host_name(value: str) -> str:
    if not HOST_NAME.match(value):
        raise SystemExit(
            f"Error: --hostname: {value!r} is not a host name (letters, digits, '.', '-' and '_', "
            "starting with a letter or digit, at most 253)"
        )
    return value


def _address(value: str | None) -> str:
    """The host's address for its peers: ``--address``, else this machine's hostname resolved."""
    if value is not None:
        if not value or any(c.isspace() or not c.isprintable() for c in value):
            raise SystemExit(f"Error: --address: {value!r} is not a host name or IP address")
        return value
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def _heartbeat(name: str, every: float, stop: threading.Event) -> None:
    """Beat every ``every`` seconds until ``stop``; a failed beat is logged and the next one tries again."""
    from airflow_quota_provider.executors.celery_worker import jobs

    launcher = jobs()
    while not stop.wait(every):
        try:
            _beat(name, launcher)
        except Exception:
            log.exception("Heartbeat of host %s failed; trying again in %.0f s", name, every)


def _beat(name: str, launcher) -> None:
    """Say the host is alive, rejoin once it was lost, and end the launches of which nothing lives
    any more (their pool process died without saying so)."""
    from airflow.utils.session import create_session
    from airflow_quota_provider.executors.containment import process_alive
    from airflow_quota_provider.models.host import HostState, end_dead_launches, heartbeat_host

    def alive(worker_pid: int, key: str) -> bool:  # the pool process, or what its launch started
        return process_alive(worker_pid) or launcher.running(key)

    with create_session() as session:
        state = heartbeat_host(name, session=session)
    if state == HostState.LOST:
        _rejoin(name, launcher)
    with create_session() as session:  # apart: a failure here must not lose the heartbeat
        for handle in end_dead_launches(name, alive, session=session):
            log.warning("Launch %s ended with its pool process (killed or died)", handle)


def _rejoin(name: str, launcher) -> None:
    """The scheduler lost this host and gave up its launches: end what of them still runs here, and
    only once none does, put the host's GPUs back in the pool."""
    from airflow.utils.session import create_session
    from airflow_quota_provider.models.host import rejoin_host

    ended = launcher.end_leftovers(timeout_s=_leftover_wait_s())
    if ended:
        log.warning("Host %s was lost: ended the launches %s that still ran here", name, ", ".join(ended))
    with create_session() as session:
        rejoin_host(name, session=session)
    log.info("Host %s rejoined: none of its evicted launches runs", name)


def _leftover_wait_s() -> float:
    from airflow.configuration import conf
    from airflow_quota_provider.executors.local_launcher import LEFTOVER_WAIT_S

    return conf.getfloat("quota", "leftover_wait_s", fallback=LEFTOVER_WAIT_S)


def worker(args) -> None:
    from airflow.cli import cli_parser
    from airflow.configuration import conf
    from airflow.utils.session import create_session
    from airflow_quota_provider.executors import celery_worker
    from airflow_quota_provider.executors.config import VIRTUAL_GPUS, discover_devices, state_dir
    from airflow_quota_provider.models.host import register_host

    name = _host_name(socket.gethostname() if args.hostname is None else args.hostname)
    address = _address(args.address)
    queue, types = _job_queue(args.queues)
    virtual = args.virtual_gpus if args.virtual_gpus is not None else conf.getint("quota", "virtual_gpus", fallback=8)
    try:
        devices, source = discover_devices(args.devices or "", virtual)
    except ValueError as e:
        raise SystemExit(f"Error: {e}")
    if not devices:
        raise SystemExit(f"Error: no GPUs found ({source}); pass --devices or --virtual-gpus")
    gpu_type = _gpu_type(args.gpu_type, queue, types, devices, source)
    if source == VIRTUAL_GPUS:
        # A task on a virtual GPU trains on the CPU: one thread each (the tasks inherit it), unless the
        # host says otherwise; PyTorch's thread per core times the host's tasks overloads it many times over.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[celery_worker.STATE_DIR_ENV] = os.path.join(state_dir(), f"host-{name}")
    try:
        ended = celery_worker.jobs().end_leftovers(timeout_s=_leftover_wait_s())
    except TimeoutError as e:  # exit 2, not 1: the host cannot prove that none of its launches runs
        print(f"Error: host {name}: {e}; its GPUs are not handed out", file=sys.stderr)
        raise SystemExit(2)
    if ended:
        log.warning("Ended the launches %s left running by an earlier worker of host %s", ", ".join(ended), name)
    with create_session() as session:
        register_host(
            name, queues=[queue], devices=devices, celery_name=f"celery@{name}", address=address, gpu_type=gpu_type,
            session=session,
        )
    log.info(
        "GPU host %s serves job queue %s with GPUs %s (%s)%s", name, queue, ",".join(devices), source,
        f" of type {gpu_type}" if gpu_type else "",
    )
    stop = threading.Event()
    every = conf.getfloat("quota", "host_heartbeat_s", fallback=5.0)
    threading.Thread(target=_heartbeat, args=(name, every, stop), name="quota-heartbeat", daemon=True).start()
    argv = [
        "celery", "worker", "--queues", celery_worker.host_queue(name),
        "--concurrency", str(args.concurrency or 2 * len(devices)), "--celery-hostname", name,
    ]
    if args.skip_serve_logs:
        argv.append("--skip-serve-logs")
    celery_args = cli_parser.get_parser().parse_args(argv)
    try:
        celery_args.func(celery_args)
    finally:
        stop.set()
