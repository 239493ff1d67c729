"""Persistence: SQLAlchemy 2 models, repositories returning domain objects, Alembic migrations."""

from trainyard.store.db import Database, make_engine, upgrade

__all__ = ["Database", "make_engine", "upgrade"]
