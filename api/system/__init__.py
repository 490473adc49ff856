"""The service's own endpoints: its health (``/api/v1/health``), its Prometheus metrics
(``/metrics``), and its OpenAPI schema and offline docs page, with the hooks that add to the schema
what drf-spectacular cannot see."""
