"""Integrations with other frameworks, each imported only by those who use it:
``import alkstore`` imports none of them (nor their framework).

- :mod:`alkstore.contrib.django`: a Django Tasks backend (docs/django.md).
- :mod:`alkstore.contrib.opentelemetry`: spans and metrics of task enqueues
  and job runs (``alkstore[opentelemetry]``, docs/operations.md).
- :mod:`alkstore.contrib.prometheus`: the same metrics, and per-queue
  gauges, for Prometheus (``alkstore[prometheus]``, docs/operations.md).
"""
