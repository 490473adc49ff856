"""Webhooks: which URLs may be called, deliveries recorded with the events they announce, signed
attempts with retries on the webhooks worker, and their admin."""
