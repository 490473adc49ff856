"""API keys: authentication, revocation (heard at once by the streams a key opened), quotas and
usage, and the views with which users list and revoke their own keys."""
