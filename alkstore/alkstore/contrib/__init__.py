"""Integrations with other frameworks, each imported only by those who use it:
``import alkstore`` imports none of them (nor their framework).

- :mod:`alkstore.contrib.django`: a Django Tasks backend (docs/django.md).
"""
