"""No models: this module exists so that Django sends this app the
``post_migrate`` signal, which it sends only to apps with a models module;
:mod:`alkstore.contrib.django.apps` creates the stores' schemas on it
(docs/django.md "Settings")."""
