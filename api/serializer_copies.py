"""Serializers on the submission path that copy their declared fields shallowly.

DRF gives every serializer instance its own fields with ``copy.deepcopy(_declared_fields)``, and
a field's deep copy re-runs its constructor from deep copies of its arguments (validators built
again, error messages merged over the class hierarchy, a nested serializer copied whole). For
``POST /api/v1/jobs`` that was the largest single cost of a request thread after the Celery
publish: 17% of a web process's Python time in a py-spy profile of 32-POST bursts on the dev VM,
and 0.08 of 0.14 ms per ``JobCreateSerializer.is_valid()`` measured alone.

The fields these serializers declare keep no state of a request: validation reads their
settings and writes nothing on them. What must not be shared is what ``bind`` sets (name,
parent, source), so each instance gets a shallow copy of every declared field, and DRF binds
the copy. The declared fields themselves are never bound. A nested serializer (``messages``'
child) is then shared by the copies of its list field: it keeps no per-call state either
(``to_internal_value`` and ``run_validation`` build their results locally).

Use it only for serializers whose fields are plain value fields like these; a field that keeps
state between calls, or a relation field that caches a queryset, needs DRF's deep copy.
"""

from __future__ import annotations

import copy
from typing import Any


class ShallowFieldCopies:
    """Mix into a ``serializers.Serializer`` (before it in the bases) whose declared fields keep
    no per-request state."""

    def get_fields(self) -> dict[str, Any]:
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}  # type: ignore[attr-defined]
