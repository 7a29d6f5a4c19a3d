"""The statements of ``vacuum_report`` (:mod:`alkstore_postgres._vacuum`)."""

from __future__ import annotations

from psycopg import sql

__all__ = ["HOLDERS", "TABLES"]

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
