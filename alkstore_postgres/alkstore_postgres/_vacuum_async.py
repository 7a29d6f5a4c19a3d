"""``AsyncPostgresStore.vacuum_report`` (the optional capability
:class:`alkstore.VacuumReporting`, docs/operations.md "Long
transactions"): the store's tables' dead row versions, and what holds the
xmin horizon that keeps vacuum from removing them.

Vacuum may remove a row version only once no transaction can still see
it: the oldest snapshot in the database (a session's ``backend_xmin``, or
its own transaction id ``backend_xid``), a replication slot's ``xmin`` or
``catalog_xmin`` (a standby with ``hot_standby_feedback``, a logical
slot nobody reads), or a prepared transaction never committed. Sessions
and prepared transactions count for this database, slots for every one.

The statements are in :mod:`alkstore_postgres._sql.vacuum`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alkstore.contract.vacuum import HorizonHolder, TableVacuum, VacuumReport
from alkstore_postgres._sql.vacuum import HOLDERS, TABLES

if TYPE_CHECKING:
    from alkstore_postgres._store_async import AsyncPostgresStore

__all__ = ["vacuum_report"]


async def vacuum_report(store: AsyncPostgresStore) -> VacuumReport:
    """See :meth:`AsyncPostgresStore.vacuum_report`."""
    async with store._db.connection() as conn:
        tables = await (await conn.execute(store.sql(TABLES), {"schema": store.schema})).fetchall()
        holders = await (await conn.execute(store.sql(HOLDERS))).fetchall()
    return VacuumReport(
        tuple(
            TableVacuum(f"{store.schema}.{name}", int(live), int(dead), vacuumed, autovacuumed)
            for name, live, dead, vacuumed, autovacuumed in tables
        ),
        tuple(HorizonHolder(kind, ident, int(age), *rest) for kind, ident, age, *rest in holders),
    )
