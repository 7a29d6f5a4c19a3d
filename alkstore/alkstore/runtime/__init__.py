"""The worker runtime, built on the public contract only: apps and tasks,
the worker and its parts, the outbox relay, the scheduler and the sweeper
(docs/tasks-and-workers.md). Import them from :mod:`alkstore`.
"""
