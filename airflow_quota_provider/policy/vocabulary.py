"""The policy's words: the values of a quota's rules and why a job is preempted.

String enums: each member is equal to its value and is a ``str``, so quota files, decision files, the
database and the audit log keep plain strings, and a member misspelt in code is an AttributeError
instead of a comparison that is silently never true. Writers of YAML turn members into plain strings
(PyYAML's safe dumper knows ``str``, not its subclasses).
"""

from __future__ import annotations

from enum import StrEnum


class Sharing(StrEnum):
    """What a quota does with its idle capacity and with others' (AWS Batch: lend, borrow)."""

    RESERVE = "reserve"
    LEND = "lend"
    LEND_AND_BORROW = "lend_and_borrow"


class WithinQuota(StrEnum):
    """Which of its own quota's jobs a waiting job may preempt (Kueue's ``withinClusterQueue``)."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "lower_or_newer_equal_priority"


class Reclaim(StrEnum):
    """Which borrowers a quota below its capacity may preempt to take its lent GPUs back (Kueue's
    ``reclaimWithinCohort``)."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"
    ANY = "any"


class OnPreemptionLimit(StrEnum):
    """What a job's preemption that uses up its ``max_preemptions`` does: fail its task, or protect it
    from further preemption."""

    FAIL = "fail"
    PROTECT = "protect"


class PreemptionReason(StrEnum):
    """Why a victim was chosen: the rule of its preemptor's quota that allowed it."""

    WITHIN_QUOTA = "within_quota"
    RECLAIM = "reclaim"
    BORROW_WITHIN = "borrow_within"
