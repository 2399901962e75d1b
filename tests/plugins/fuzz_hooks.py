"""Schemathesis hooks for tests/plugins/test_openapi_fuzz.py (loaded through ``SCHEMATHESIS_HOOKS``).

The fuzzer runs on the api-server the other plugin, sensor and trigger tests share. A PATCH whose
generated id names a job that the fuzz test did not seed is sent to one of its own jobs instead
(``QUOTA_FUZZ_OWN_JOBS``; ids up to ``QUOTA_FUZZ_LAST_FOREIGN`` belong to others), so that the
fuzzer never changes another test's rows. Ids no job has are sent as generated.
"""

from __future__ import annotations

import os

import schemathesis

OWN = [int(x) for x in os.environ.get("QUOTA_FUZZ_OWN_JOBS", "").split(",") if x]
LAST_FOREIGN = int(os.environ.get("QUOTA_FUZZ_LAST_FOREIGN", "0"))


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    job_id = (case.path_parameters or {}).get("job_id")
    if not (OWN and isinstance(job_id, str) and job_id.isascii() and job_id.isdigit()):
        return
    number = int(job_id)
    if number not in OWN and 1 <= number <= max(LAST_FOREIGN, max(OWN)):
        case.path_parameters["job_id"] = str(OWN[number % len(OWN)])
