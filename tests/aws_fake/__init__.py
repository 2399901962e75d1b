"""A local fake of AWS Batch's quota-share and service-job API, reached by boto3 over HTTP."""

from __future__ import annotations

import os
import tempfile

# Tests of the AWS backend never touch ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-home-aws-"))
