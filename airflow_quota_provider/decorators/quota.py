"""``@task.quota(...)``: a Python callable on a shared GPU quota, preempted into a reschedule.

Usage::

    @task.quota(quota="team-a", gpus=2, priority=50, grace_period=60, expected_runtime=timedelta(hours=2))
    def train(quota=None):  # ``quota`` is a QuotaRun (must default to None)
        state = torch.load(quota.resume_from) if quota.resume_from else fresh()
        try:
            for step in range(state.step, total):
                ...
                if step % 100 == 0:
                    save(quota.checkpoint_dir / f"ckpt-{step:08d}.pt")
        finally:                # runs on QuotaPreempted too: checkpoint here
            save(quota.checkpoint_dir / f"ckpt-{step:08d}.pt")

How a callable learns that it is preempted (``on_preempt``):

- ``"raise"`` (default): :class:`QuotaPreempted` is raised in the callable at once, the way
  SIGTERM interrupts a process. It derives from ``BaseException``, so ``except Exception`` does not
  swallow it; write the checkpoint in ``finally`` or ``except QuotaPreempted``.
- ``"flag"``: nothing is raised at first; ``quota.preempt_requested`` becomes True and the
  callable should checkpoint and return (or ``raise QuotaPreempted``) within the grace period.
  When the grace period is over, :class:`QuotaPreempted` is raised anyway.

Once preemption was requested, the run ends as ``UP_FOR_RESCHEDULE`` (no retry used, same
``try_number``) however the callable ends. The callable also sees ``QUOTA_CHECKPOINT_DIR``,
``QUOTA_RESUME_FROM`` and ``QUOTA_PREEMPTION_COUNT`` in ``os.environ``, and ``CUDA_VISIBLE_DEVICES``
(and in a job queue with GPU types ``QUOTA_GPU_TYPE``, the type it got: ``gpu_type`` asks for one or
several in order of preference) as set by the executor. :func:`current_quota_run` returns the same
object as ``quota``.

A task on several hosts (``nodes`` > 1) is refused when the DAG is parsed: the gang's other nodes
are not Airflow tasks and run node 0's command, and a Python callable is none; use
QuotaTrainingOperator (``torchrun ...``) for it.

Checkpoints are found and kept as for QuotaTrainingOperator (``checkpoint_dir``, templated, or
``[quota] checkpoint_root``): ``quota.checkpoint_dir`` and ``quota.resume_from`` are always local
paths. When the checkpoints live in an object store, they are a working copy: the newest checkpoint
is downloaded before the callable starts, and what it wrote is uploaded when it has returned or
raised (after a preemption only the newest checkpoint), and the working copy is then removed: to
return a checkpoint, return its place in the store (``str(quota.sync.remote / name)``), not its
local path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import DecoratedOperator, context_merge, task_decorator_factory
from airflow.providers.standard.operators.python import PythonOperator

from airflow_quota_provider.operators.arguments import (
    DEFAULT_EXECUTOR,
    QuotaTaskArgumentError,
    check_int,
    quota_operator_kwargs,
    quota_partial_kwargs,
)
from airflow_quota_provider.operators.quota_run import POLL_INTERVAL_S, QuotaPreempted, QuotaRun
from airflow_quota_provider.operators.training import QuotaTaskMixin
from airflow_quota_provider.protocol import MAX_NODES

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import Context, TaskDecorator

ON_PREEMPT_VALUES = ("raise", "flag")
_current: QuotaRun | None = None


def current_quota_run() -> QuotaRun | None:
    """The :class:`QuotaRun` of the ``@task.quota`` callable running in this process, if any."""
    return _current


class _QuotaDecoratedOperator(QuotaTaskMixin, DecoratedOperator, PythonOperator):
    """A ``@task.quota`` task: a Python callable with the quota arguments of QuotaTrainingOperator."""

    template_fields: Sequence[str] = ("templates_dict", "op_args", "op_kwargs", "checkpoint_dir")
    template_fields_renderers = {"templates_dict": "json", "op_args": "py", "op_kwargs": "py"}
    custom_operator_name: str = "@task.quota"

    def __init__(
        self,
        *,
        python_callable: Callable,
        op_args: Any = None,
        op_kwargs: Any = None,
        quota: str,
        gpus: int = 1,
        nodes: int = 1,
        gpu_type: str | Sequence[str] | None = None,
        priority: int = 0,
        checkpoint_dir: str | None = None,
        max_preemptions: int | None = None,
        grace_period: float | timedelta | None = None,
        preemptible: bool = True,
        expected_runtime: float | timedelta | None = None,
        on_preempt: str = "raise",
        executor: str | None = DEFAULT_EXECUTOR,
        **kwargs: Any,
    ) -> None:
        _check_on_preempt(on_preempt)
        _check_one_host(nodes)  # also for .override(nodes=...), which skips quota_task
        quota_args = {"quota": quota, "gpus": gpus, "nodes": nodes, "gpu_type": gpu_type, "priority": priority,
                      "max_preemptions": max_preemptions, "grace_period": grace_period, "preemptible": preemptible,
                      "expected_runtime": expected_runtime}  # fmt: skip
        kwargs_to_upstream = {"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs}
        super().__init__(
            kwargs_to_upstream=kwargs_to_upstream,
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **quota_operator_kwargs(**quota_args, executor=executor, kwargs=kwargs),
        )
        self._set_quota_args(checkpoint_dir=checkpoint_dir, **quota_args)
        self.on_preempt = on_preempt

    def execute(self, context: Context) -> Any:
        global _current
        run = self._start_run(context, "callable")
        context_merge(context, {"quota": run})
        _current = run
        try:
            with _environ(run.env()), _preemption_delivery(run, self.on_preempt, self.log):
                result = super().execute(context)
        except QuotaPreempted:
            run.save_checkpoints(self.log, preempted=True, strict=False)
            raise run.preemption_outcome(self.log) from None
        except Exception:
            run.save_checkpoints(self.log, preempted=run.notice is not None, strict=False)
            if run.notice is not None:  # interrupted by the preemption in some other way
                raise run.preemption_outcome(self.log) from None
            raise
        except BaseException:  # a timeout, an exit: keep what the callable wrote all the same
            run.save_checkpoints(self.log, preempted=run.notice is not None, strict=False)
            raise
        finally:
            _current = None
        run.save_checkpoints(self.log, preempted=run.notice is not None, strict=run.notice is None)
        if run.notice is not None:
            raise run.preemption_outcome(self.log)
        return result


def _check_on_preempt(value: Any) -> None:
    if value not in ON_PREEMPT_VALUES:
        raise QuotaTaskArgumentError("on_preempt", f"{value!r} is not one of {', '.join(ON_PREEMPT_VALUES)}")


def _check_one_host(nodes: Any) -> None:
    check_int("nodes", nodes, minimum=1, maximum=MAX_NODES)
    if nodes > 1:
        raise QuotaTaskArgumentError(
            "nodes", f"{nodes!r} is not 1; nodes > 1 needs a command every host runs: use QuotaTrainingOperator"
        )


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _preemption_delivery(run: QuotaRun, on_preempt: str, log) -> Iterator[None]:
    """
    Watch the preempt file and interrupt the callable the way SIGTERM would.

    A watcher thread polls the file; when it appears (or the executor sends SIGTERM after writing
    it), a SIGTERM handler on the main thread raises :class:`QuotaPreempted` (``"raise"``), or only
    once the grace period is over (``"flag"``). A SIGTERM without a notice goes to the handler that
    was installed before (Airflow's, which calls ``on_kill``).
    """
    if threading.current_thread() is not threading.main_thread() or run.preempt_file is None:
        yield
        return
    main_ident = threading.main_thread().ident
    previous = signal.getsignal(signal.SIGTERM)
    state = {"raised": False, "force": False}
    done = threading.Event()

    def _on_sigterm(signum, frame):
        if run.poll_preemption() is None:
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            return
        if not state["raised"] and (on_preempt == "raise" or state["force"]):
            state["raised"] = True
            raise QuotaPreempted(run.notice)

    def _watch():
        while not done.wait(POLL_INTERVAL_S):
            if run.poll_preemption() is not None:
                break
        else:
            return
        stop_at = run.stop_at(time.time())
        log.warning(
            "Preempted (%s) by %s: %s; grace period %.1fs",
            run.notice.reason,
            run.notice.preemptor or "the quota executor",
            "raising QuotaPreempted in the callable" if on_preempt == "raise" else "quota.preempt_requested is set",
            stop_at - time.time(),
        )
        if on_preempt == "raise":
            signal.pthread_kill(main_ident, signal.SIGTERM)
        if done.wait(max(0.0, stop_at - time.time())):
            return
        log.warning("The callable did not stop within the grace period; raising QuotaPreempted")
        state["force"] = True
        signal.pthread_kill(main_ident, signal.SIGTERM)

    signal.signal(signal.SIGTERM, _on_sigterm)
    watcher = threading.Thread(target=_watch, name="quota-preempt-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.signal(signal.SIGTERM, previous)
        watcher.join()


def quota_task(python_callable: Callable | None = None, **kwargs: Any) -> TaskDecorator:
    """
    Wrap a function into a quota task (``@task.quota``).

    Takes the arguments of :class:`~airflow_quota_provider.operators.training.QuotaTrainingOperator`
    except ``command``/``env``/``cwd``, plus ``on_preempt`` (``"raise"`` or ``"flag"``), and the usual
    ``BaseOperator`` arguments; ``nodes`` only as 1, since a callable cannot run on a gang's other
    hosts. Among them ``expected_runtime`` (seconds or a ``timedelta``): how long one run takes, for
    the victim search (the least work lost; a run about to end is waited for, not preempted) and the
    estimated start of waiting jobs; None (default): the median of the task's recent successful
    durations, else its ``execution_timeout``, else unknown.
    """
    _check_on_preempt(kwargs.get("on_preempt", "raise"))
    _check_one_host(kwargs.get("nodes", 1))
    return task_decorator_factory(
        python_callable=python_callable,
        decorated_operator_class=_QuotaDecoratedOperator,
        # Resolved now, so that a mapped (.expand) task has its pool and GPUs before it is unmapped.
        **quota_partial_kwargs(kwargs),
    )
