"""airflow-quota-provider: shared GPU quotas for Apache Airflow."""

__version__ = "0.1.0"
