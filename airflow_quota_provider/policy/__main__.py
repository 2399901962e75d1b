"""``python -m airflow_quota_provider.policy``: dry-run the policy from files (DESIGN §4).

    decide FILE.json|-      print the decision for a decision file as JSON
    validate QUOTAS.yaml    check a quota file and print a summary of its queues

Bad input exits with status 2 and one line naming the field and the allowed values.
"""

from __future__ import annotations

import argparse
import json
import sys

from airflow_quota_provider.policy.config import MAX_QUOTAS_PER_QUEUE, Cohort, Queue, Quota, load_quota_file
from airflow_quota_provider.policy.cycle import decide
from airflow_quota_provider.policy.documents import DECISION_FILE_LIMITS, load_json
from airflow_quota_provider.policy.errors import PolicyError
from airflow_quota_provider.policy.state import parse_state


def _read_json(source: str):
    return load_json(sys.stdin.buffer if source == "-" else source, DECISION_FILE_LIMITS, what="decision file")


def _decide(args: argparse.Namespace) -> None:
    state, now = parse_state(_read_json(args.file), max_quotas_per_queue=args.max_quotas)
    json.dump(decide(state, now).to_dict(), sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")


def _validate(args: argparse.Namespace) -> None:
    quota_file = load_quota_file(args.file, max_quotas_per_queue=args.max_quotas)
    for queue in quota_file.queues:
        assigned = sum(q.capacity for q in queue.quotas) + sum(c.capacity for c in queue.cohorts)
        print(f"job queue {queue.name}: {queue.capacity} GPUs, {len(queue.quotas)} quotas, {queue.capacity - assigned} in the common pool")
        _print_tree(queue, "  ")
    print("ok")


def _limits(entry) -> str:
    limits = [f"{key} {value}" for key in ("borrow_limit", "lend_limit") if (value := getattr(entry, key)) is not None]
    return "".join(f", {limit}" for limit in limits)


def _print_tree(queue: Queue, indent: str) -> None:
    """The quotas under the queue's root, then each cohort followed by its own, indented by level.
    A stack, not recursion, and each entry looked at once: the tree may be as deep as the file allows."""
    quotas: dict[str | None, list[Quota]] = {}
    for quota in queue.quotas:
        quotas.setdefault(quota.cohort, []).append(quota)
    children: dict[str | None, list[Cohort]] = {}
    for cohort in queue.cohorts:
        children.setdefault(cohort.parent, []).append(cohort)
    stack: list[tuple[Cohort | None, str]] = [(None, indent)]  # None: the root
    while stack:
        cohort, indent = stack.pop()
        if cohort is not None:
            print(f"{indent}cohort {cohort.name}: capacity {cohort.capacity}{_limits(cohort)}")
            indent += "  "
        level = None if cohort is None else cohort.name
        for quota in quotas.get(level, ()):
            print(f"{indent}{quota.name}: capacity {quota.capacity}, {quota.sharing}{_limits(quota)}")
        stack.extend((child, indent) for child in reversed(children.get(level, ())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_quota_provider.policy", description=__doc__.split("\n")[0])
    parser.add_argument("--max-quotas", type=int, default=MAX_QUOTAS_PER_QUEUE, help="quotas allowed per job queue (default %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    decide_parser = commands.add_parser("decide", help="print the decision for a decision file (JSON; - for stdin)")
    decide_parser.add_argument("file")
    decide_parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    decide_parser.set_defaults(run=_decide)
    validate_parser = commands.add_parser("validate", help="check a quota file (YAML)")
    validate_parser.add_argument("file")
    validate_parser.set_defaults(run=_validate)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except PolicyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
