"""``PostgresStore.vacuum_report`` (the optional capability
:class:`alkstore.VacuumReporting`, docs/operations.md "Long
transactions"): the store's tables' dead row versions, and what holds the
xmin horizon that keeps vacuum from removing them.

Vacuum may remove a row version only once no transaction can still see
it: the oldest snapshot in the database (a session's ``backend_xmin``, or
its own transaction id ``backend_xid``), a replication slot's ``xmin`` or
``catalog_xmin`` (a standby with ``hot_standby_feedback``, a logical
slot nobody reads), or a prepared transaction never committed. Sessions
and prepared transactions count for this database, slots for every one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import sql

from alkstore.contract.vacuum import HorizonHolder, TableVacuum, VacuumReport

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = ["vacuum_report"]

TABLES = sql.SQL("""
    SELECT relname, n_live_tup, n_dead_tup, last_vacuum, last_autovacuum
    FROM pg_stat_user_tables WHERE schemaname = %(schema)s
    ORDER BY relname
""")

# The oldest first; the report's own session is not one of them, nor
# autovacuum (its snapshot holds back no other vacuum).
HOLDERS = sql.SQL("""
    SELECT * FROM (
        SELECT 'session' AS kind, pid::text,
               greatest(age(backend_xmin), age(backend_xid)) AS age,
               extract(epoch FROM clock_timestamp() - xact_start)::float8,
               xact_start, state, query_start, application_name, left(query, 200)
        FROM pg_stat_activity
        WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
          AND pid <> pg_backend_pid()
          AND backend_type <> 'autovacuum worker'
          AND (datname = current_database() OR datname IS NULL)
        UNION ALL
        SELECT 'replication slot', slot_name,
               greatest(age(xmin), age(catalog_xmin)),
               NULL, NULL, CASE WHEN active THEN 'active' ELSE 'inactive' END,
               NULL, NULL, NULL
        FROM pg_replication_slots
        WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared transaction', gid, age(transaction),
               extract(epoch FROM clock_timestamp() - prepared)::float8,
               prepared, NULL, NULL, NULL, NULL
        FROM pg_prepared_xacts
        WHERE database = current_database()
    ) AS holders
    ORDER BY age DESC, kind, pid
    LIMIT 5
""")


def vacuum_report(store: PostgresStore) -> VacuumReport:
    """See :meth:`PostgresStore.vacuum_report`."""
    with store._db.connection() as conn:
        tables = conn.execute(store.sql(TABLES), {"schema": store.schema}).fetchall()
        holders = conn.execute(store.sql(HOLDERS)).fetchall()
    return VacuumReport(
        tuple(
            TableVacuum(f"{store.schema}.{name}", int(live), int(dead), vacuumed, autovacuumed)
            for name, live, dead, vacuumed, autovacuumed in tables
        ),
        tuple(HorizonHolder(kind, ident, int(age), *rest) for kind, ident, age, *rest in holders),
    )
