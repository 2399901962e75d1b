"""Provider-owned tables: jobs, device allocations, the audit log and preemption counts.

Every state change goes through a function in :mod:`.job` that takes a keyword-only ``session``;
the executor, the CLI and the REST API call the same functions.
"""
