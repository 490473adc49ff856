"""Create (or reuse) a user and give them a new API key; prints the key's secret and its webhook
signing secret once. With ``--replace``, the user's earlier keys of that name are revoked (``make
run`` mints its demo key this way, so only the latest one works)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from api.keys.services import api_key_create, api_key_replace


class Command(BaseCommand):
    help = "Create a user (if needed) with a new API key and print the key. --staff/--password for admin access."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--password", default=None, help="set this password (enables admin login with --staff)")
        parser.add_argument("--staff", action="store_true", help="make the user a superuser (admin access)")
        parser.add_argument("--key-name", default="default")
        parser.add_argument("--replace", action="store_true",
                            help="revoke the user's earlier keys of this --key-name: only the new one is valid")
        parser.add_argument("--quiet", action="store_true", help="print only the key")
        parser.add_argument("--with-webhook-secret", action="store_true",
                            help="with --quiet: print the key's webhook signing secret on a second line")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=options["username"], defaults={"email": options["email"]}
        )
        if options["password"]:
            user.set_password(str(options["password"]))
        if options["staff"]:
            user.is_staff = user.is_superuser = True
        user.save()
        name = str(options["key_name"])
        if options["replace"]:
            api_key, secret = api_key_replace(owner=user, name=name)
        else:
            api_key, secret = api_key_create(owner=user, name=name)
        if options["quiet"]:
            self.stdout.write(secret)
            if options["with_webhook_secret"]:
                self.stdout.write(api_key.webhook_secret)
            return
        verb = "Created" if created else "Found"
        # The key's secret stays the last line, for scripts that read it.
        self.stdout.write(f"{verb} user {user.username}. The new key's webhook signing secret (shown once): "
                          f"{api_key.webhook_secret}")
        self.stdout.write(f"New API key {api_key.prefix}… (shown once):")
        self.stdout.write(secret)
