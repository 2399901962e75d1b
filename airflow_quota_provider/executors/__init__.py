"""QuotaExecutor: runs Airflow tasks on shared GPU quotas, with borrowing and priority preemption."""
