"""``airflow quota ...`` commands."""
