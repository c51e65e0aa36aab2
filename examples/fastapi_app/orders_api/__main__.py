"""``python -m orders_api init-db``: pgqueue's tables (its own Alembic lineage), then the
service's own tables (a real service would run its Alembic migrations for those)."""

from __future__ import annotations

import asyncio
import sys

from orders_api.database import Base, engine
from orders_api.models import Order, Receipt  # noqa: F401 - registers the tables
from orders_api.tasks import pgq


async def create_tables() -> None:
    async with engine.begin() as connection:
        await connection.run_sync(Base.metadata.create_all)
    await engine.dispose()


def main(argv: list[str]) -> None:
    if argv != ["init-db"]:
        sys.exit("usage: python -m orders_api init-db")
    pgq.migrate()
    asyncio.run(create_tables())
    print("pgqueue's tables migrated, the service's tables created")


if __name__ == "__main__":
    main(sys.argv[1:])
