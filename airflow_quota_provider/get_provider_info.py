"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``).

Each helper adds or edits only its own keys.
"""

from __future__ import annotations


def get_provider_info():
    return {
        "package-name": "airflow-quota-provider",
        "name": "Airflow Quota Provider",
        "description": "Shared GPU quotas for Apache Airflow: borrowing, lending and priority preemption.",
        "versions": ["0.2.0", "0.1.0"],
        # --- AWS Batch backend (quota shares, SageMaker training service jobs) ---
        "integrations": [
            {
                "integration-name": "AWS Batch shared quotas",
                "external-doc-url": "https://docs.aws.amazon.com/batch/latest/userguide/",
                "tags": ["aws"],
            }
        ],
        "hooks": [
            {
                "integration-name": "AWS Batch shared quotas",
                "python-modules": ["airflow_quota_provider.hooks.batch_quota"],
            }
        ],
        "operators": [
            {
                "integration-name": "AWS Batch shared quotas",
                "python-modules": ["airflow_quota_provider.operators.batch_training"],
            }
        ],
        "sensors": [
            {
                "integration-name": "AWS Batch shared quotas",
                "python-modules": ["airflow_quota_provider.sensors.batch_service_job"],
            }
        ],
        "triggers": [
            {
                "integration-name": "AWS Batch shared quotas",
                "python-modules": ["airflow_quota_provider.triggers.batch_service_job"],
            }
        ],
        # --- task side (QuotaTrainingOperator, @task.quota) ---
        "task-decorators": [
            {"class-name": "airflow_quota_provider.decorators.quota.quota_task", "name": "quota"}
        ],
        # The task instance's link to its job on the quota page (also the plugin's: see operators/links.py).
        "extra-links": ["airflow_quota_provider.operators.links.QuotaJobLink"],
        # --- executor, tables and CLI (QuotaExecutor) ---
        "executors": ["airflow_quota_provider.executors.quota_executor.QuotaExecutor"],
        "db-managers": ["airflow_quota_provider.models.db.QuotaDBManager"],
        "cli": ["airflow_quota_provider.cli.definition.get_quota_cli_commands"],
        # --- REST API, UI page (plugins/) ---
        # No "plugins" key: the plugin is the package's airflow.plugins entry point, which Airflow loads
        # whatever [core] lazy_discover_providers says; declared here as well it was loaded a second
        # time with eager discovery and reported as an import error ("already registered").
        "config": {
            "quota": {
                "description": "Shared GPU quotas: the quota file and the local GPU launcher of QuotaExecutor.",
                "options": {
                    "quota_file": {
                        "description": "Path of the quota file (YAML: queues, quotas, sharing and "
                        "preemption rules). QuotaExecutor refuses to start when it is invalid and keeps "
                        "the last good configuration when it becomes invalid while running.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/opt/airflow/quotas.yaml",
                        "default": "",
                    },
                    "devices": {
                        "description": "Comma-separated GPU indexes the local launcher may hand out. "
                        "Empty: ask nvidia-smi, and without it use virtual_gpus.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "0,1,2,3",
                        "default": "",
                    },
                    "virtual_gpus": {
                        "description": "How many virtual GPUs (indexes 0..N-1) to hand out when there is "
                        "neither [quota] devices nor nvidia-smi, so that quotas work on any laptop.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "8",
                        "default": "8",
                    },
                    "gpu_type": {
                        "description": "The type of the local launcher's GPUs (one machine holds one "
                        "type), as the quota file's GPU types name it: a job queue whose capacity is a "
                        "mapping {type: GPUs} needs it, and must have that type only (GPU hosts of several "
                        "types need the celery launcher). Empty: from nvidia-smi's model name (NVIDIA H100 "
                        "80GB HBM3 is h100), none for virtual GPUs.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "h100",
                        "default": "",
                    },
                    "state_dir": {
                        "description": "Directory for per-job files (preempt notices, exit codes). "
                        "Empty: AIRFLOW_HOME/quota.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/quota",
                        "default": "",
                    },
                    "process_cgroups": {
                        "description": "auto: contain each local launch's processes in a cgroup v2 of "
                        "its own where the kernel lets the scheduler make one below its own cgroup (its "
                        "devices are then free only when the cgroup is empty, and a kill reaches every "
                        "process, even one a killed supervisor left behind); off: the subreaper alone "
                        "(the task supervisor adopts and ends what its task leaves behind).",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "off",
                        "default": "auto",
                    },
                    "checkpoint_root": {
                        "description": "Where quota tasks keep their checkpoints, so that a run "
                        "rescheduled onto another GPU host resumes from them: a task instance's "
                        "directory is <checkpoint_root>/<dag_id>/<run_id>/<task_id>[/<map_index>]. An "
                        "absolute path or a file:// URL (shared storage) is used in place; an object-store "
                        "URL (s3://bucket/prefix, s3://conn_id@bucket/prefix, or any scheme "
                        "ObjectStoragePath knows) is synced: the newest checkpoint is downloaded before the "
                        "command starts and new ones are uploaded when it exits. Empty: "
                        "[quota] state_dir/checkpoints on each worker's own disk. A task's checkpoint_dir "
                        "overrides it.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "s3://ml-checkpoints/airflow",
                        "default": "",
                    },
                    "estimate_interval_s": {
                        "description": "How often, at most, the estimated start of every waiting job is "
                        "forecast (the policy run forward with expected runtimes, in a background thread of "
                        "the scheduler; shown by `airflow quota jobs|explain`, the REST API and the quota "
                        "page). 0: never.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "60",
                        "default": "30",
                    },
                    "default_quota": {
                        "description": "Quota of a task whose pool is not a quota name and whose "
                        "executor_config has no quota (empty: such a task fails with a clear message).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "team-a",
                        "default": "",
                    },
                    "launcher": {
                        "description": "Where QuotaExecutor runs tasks: local (forked on the scheduler's "
                        "machine, its GPUs from devices / nvidia-smi / virtual_gpus) or celery (on the GPU "
                        "hosts of a fleet, each running `airflow quota worker`; needs the Celery provider, "
                        "a broker and a database that the hosts share).",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "celery",
                        "default": "local",
                    },
                    "host_heartbeat_s": {
                        "description": "How often a GPU host's worker (`airflow quota worker`) heartbeats.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "5",
                        "default": "5",
                    },
                    "launch_start_timeout_s": {
                        "description": "A launch that its GPU host has not taken this long after it was "
                        "sent (its message lost, for example with a broker restart) is undone: the job "
                        "goes back to its place and is launched again; a late delivery is refused. "
                        "An admission whose launch was never noted (its scheduler stopped meanwhile) is "
                        "recovered after the same time.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "60",
                        "default": "60",
                    },
                    "leftover_wait_s": {
                        "description": "How long `airflow quota worker` waits, at start and when its "
                        "lost host rejoins, for killed launches of its jobs to be gone before it hands "
                        "its GPUs out; past it the worker exits 2 (at start) or the host stays lost.",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "60",
                        "default": "60",
                    },
                    "gang_start_timeout_s": {
                        "description": "A job on several hosts (a gang, `nodes` > 1) whose nodes are not all "
                        "started this long after its admission (node 0 publishes its command, then every "
                        "other node's host takes its launch) is ended without using an Airflow retry and "
                        "admitted again after a backoff.",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "300",
                        "default": "300",
                    },
                    "gang_backoff_s": {
                        "description": "How long a gang whose start failed waits before it is admitted "
                        "again; doubled with each failed start (Kueue's waitForPodsReady requeuing).",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "60",
                        "default": "60",
                    },
                    "gang_start_limit": {
                        "description": "Failed starts after which a gang's next failed start fails its "
                        "task, saying so.",
                        "version_added": "0.3.0",
                        "type": "integer",
                        "example": "5",
                        "default": "5",
                    },
                    "host_lost_after_s": {
                        "description": "A GPU host silent this long is lost: its GPUs leave the pool and "
                        "its jobs are requeued at their original place without using an Airflow retry "
                        "(audit event evicted). It rejoins with its next heartbeat.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "30",
                        "default": "30",
                    },
                    "keep_queued_alive": {
                        "description": "Keep tasks that wait for quota from being timed out by "
                        "[scheduler] task_queued_timeout: their queued time is refreshed while they wait.",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "True",
                    },
                },
            }
        },
    }
