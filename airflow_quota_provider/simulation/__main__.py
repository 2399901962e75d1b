"""``python -m airflow_quota_provider.simulation run --trace CSV --config QUOTAS.yaml ...``"""

from airflow_quota_provider.simulation.cli import main

raise SystemExit(main())
