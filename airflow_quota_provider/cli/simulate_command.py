"""``airflow quota simulate``: replay a trace through the quota policy and its baselines.

The same options as ``python -m airflow_quota_provider.simulation run`` (one definition,
:data:`airflow_quota_provider.simulation.cli.SIMULATE_ARGS`); wire :data:`SIMULATE_COMMAND` into
``QUOTA_COMMANDS``. Bad input and failed checks end in ``SystemExit("Error: ...")``.
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.cli.cli_config import ActionCommand, Arg, lazy_load_command

from airflow_quota_provider.simulation.cli import SIMULATE_ARGS as _SPEC

SIMULATE_ARGS = tuple(Arg(flags, **kwargs) for flags, kwargs in _SPEC)

SIMULATE_COMMAND = ActionCommand(
    name="simulate",
    help="Replay a job trace under the quota file (quota), static partitions (static) and one FIFO (fifo)",
    func=lazy_load_command("airflow_quota_provider.cli.simulate_command.simulate"),
    args=SIMULATE_ARGS,
)


def simulate(args: Any) -> None:
    """Body of ``airflow quota simulate``: prints the table; ``--json``/``--plot`` write the rest."""
    from airflow_quota_provider.policy import PolicyError
    from airflow_quota_provider.simulation.cli import format_table, run_from_args
    from airflow_quota_provider.simulation.engine import CheckError
    from airflow_quota_provider.simulation.workload import InputError

    try:
        run = run_from_args(args)
    except (InputError, PolicyError) as error:
        raise SystemExit(f"Error: {error}") from None
    except CheckError as error:
        raise SystemExit(f"Error: check failed: {error}") from None
    print(format_table(run.report))
    for name, seconds in run.replay_s.items():
        print(f"replay {name}: {seconds:.1f} s", file=sys.stderr)
