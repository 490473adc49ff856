"""What the service refuses to start with outside DEBUG: the settings an example deployment ships
as placeholders.

A copied compose file or ``.env`` that still says ``SECRET_KEY=change-me-in-production`` signs
every admin session and CSRF token with a key anyone can read, and ``ALLOWED_HOSTS=*`` turns off
Django's Host-header check (password-reset links, absolute URLs). Neither may reach a deployment
silently, so settings.py raises ``ImproperlyConfigured`` at load time: every process (daphne,
the engine worker, Celery, ``manage.py``) stops with the reason instead of serving.

The embedded default key (``SECRET_KEY`` unset) is the developer machine's, as for ``make run``
and the tests; a deployment sets its own.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

# The placeholders of the repository's docker-compose.yml and of common examples; an empty value
# ("SECRET_KEY=" in an env file) is refused as well.
PLACEHOLDER_SECRET_KEYS = frozenset({"", "change-me-in-production", "changeme", "change-me", "secret"})


def unsafe_setting_errors(*, debug: bool, secret_key: str | None, allowed_hosts: list[str]) -> list[str]:
    """Why these settings must not serve, one sentence each; none when ``debug`` is on.
    ``secret_key``: the environment's SECRET_KEY as given (None when unset)."""
    if debug:
        return []
    errors = []
    if secret_key is not None and secret_key.strip().lower() in PLACEHOLDER_SECRET_KEYS:
        shown = "empty" if not secret_key.strip() else f"the placeholder {secret_key.strip()!r}"
        errors.append(f"SECRET_KEY is {shown}: set it to a long random string, e.g. the output of "
                      "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`.")
    if "*" in allowed_hosts:
        errors.append("ALLOWED_HOSTS contains '*', which accepts any Host header: list the host names "
                      "the service is reached by (e.g. ALLOWED_HOSTS=api.example.com,localhost).")
    return errors


def refuse_unsafe_settings(*, debug: bool, secret_key: str | None, allowed_hosts: list[str]) -> None:
    """Raise ImproperlyConfigured naming every unsafe setting (see :func:`unsafe_setting_errors`)."""
    errors = unsafe_setting_errors(debug=debug, secret_key=secret_key, allowed_hosts=allowed_hosts)
    if errors:
        raise ImproperlyConfigured("Refusing to start with DEBUG off: " + " ".join(errors)
                                   + " (DEBUG=1 allows them on a developer machine.)")
