"""The engine's statements, and the pure values and helpers around them.

Shared by the async I/O modules (``_*_async.py``) and the sync modules
generated from them (docs/async.md "How the engines do it"): the text of
each statement is written once, here, and both faces import it. One module
per I/O module it serves (``_sql.queue`` for ``_queue``/``_queue_async``
...); the schema's DDL and the rendering of statements for a store's schema
are in :mod:`alkstore_postgres._schema`.
"""
