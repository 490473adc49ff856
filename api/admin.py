"""The app's admin: each domain registers its own models (api/<domain>/admin.py); Django's admin
autodiscovery imports this module, which imports theirs. The engine dashboard is a separate staff
view (api/dashboard/views.py), linked from every admin page."""

from __future__ import annotations

from api.batches import admin as batches_admin
from api.jobs import admin as jobs_admin
from api.keys import admin as keys_admin
from api.webhooks import admin as webhooks_admin

__all__ = ["batches_admin", "jobs_admin", "keys_admin", "webhooks_admin"]
