"""The operator dashboard served at ``/ui`` (see docs/dashboard.md): ``access`` (tokens, no web
framework: ``relay dashboard-url`` imports it), ``api`` (the JSON API and ``Dashboard``, what it runs
on), ``app`` (the ASGI app), ``snapshot`` (the shared agents overview), ``traffic``, ``static/``."""
