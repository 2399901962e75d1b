"""Alembic environment of the provider's tables; runs on Airflow's engine with its own version table."""

from __future__ import annotations

import contextlib
from logging import getLogger
from logging.config import fileConfig

from alembic import context

from airflow import settings
from airflow_quota_provider.models.db import QuotaDBManager

config = context.config
if not getLogger().handlers and config.config_file_name:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = QuotaDBManager.metadata
version_table = QuotaDBManager.version_table_name


def include_object(_, name, type_, *args):
    if type_ == "table" and name not in target_metadata.tables:
        return False
    return True


def run_migrations_offline():
    context.configure(
        url=settings.SQL_ALCHEMY_CONN,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        include_object=include_object,
        version_table=version_table,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    with contextlib.ExitStack() as stack:
        connection = config.attributes.get("connection", None)
        if not connection:
            connection = stack.push(settings.engine.connect())
        context.configure(
            connection=connection,
            transaction_per_migration=True,
            target_metadata=target_metadata,
            include_object=include_object,
            render_as_batch=True,
            version_table=version_table,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
