"""Operators' admin of users and their API keys (revoke, rotate the webhook secret, the models a
key may use) and of the keys' daily usage."""

from __future__ import annotations

from functools import partial

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from api.keys.quotas import usage_rollup
from api.keys.services import (
    api_key_generate_secret,
    api_key_revocation_announce,
    api_key_revoke,
    api_key_rotate_webhook_secret,
    api_key_set_secret,
)
from api.models import ApiKey, UsageRecord
from api.serving.catalog import configured_models

User = get_user_model()
QUOTA_FIELDS = ("requests_per_minute", "tokens_per_day", "max_concurrent_jobs", "max_tokens_per_job", "priority")


class ApiKeyInline(admin.TabularInline):
    """A user's keys, read-only (new keys are made in the key admin, which shows the secret once)."""

    model = ApiKey
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("prefix", "name", "created_at", "last_used_at", "revoked_at", *QUOTA_FIELDS)
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class UserWithKeysAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, ApiKeyInline]


admin.site.unregister(User)
admin.site.register(User, UserWithKeysAdmin)


class ApiKeyForm(forms.ModelForm):
    """The key's models as checkboxes of the configured ones (none ticked: every model)."""

    allowed_models = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple,
        help_text="The models this key may use; none ticked: every model. Others are refused with a 403.")

    class Meta:
        model = ApiKey
        fields = "__all__"

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - Django's form signature
        super().__init__(*args, **kwargs)
        names = [m.name for m in configured_models()]
        # A model no longer configured stays listed while the key names it, so saving keeps it.
        names += [n for n in (self.instance.allowed_models or []) if n not in names]
        field = self.fields["allowed_models"]
        assert isinstance(field, forms.ChoiceField)  # the form declares it a multiple choice
        field.choices = [(n, n) for n in names]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ("prefix", "name", "owner", "created_at", "last_used_at", "revoked_at", *QUOTA_FIELDS)
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("prefix", "name", "owner__username", "owner__email")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    fields = ("owner", "name", "prefix", "created_at", "last_used_at", "revoked_at", *QUOTA_FIELDS, "allowed_models")
    autocomplete_fields = ("owner",)
    actions = ("revoke_keys", "rotate_webhook_secrets")

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if not change:
            raw = api_key_generate_secret()
            api_key_set_secret(api_key=obj, raw=raw)
            super().save_model(request, obj, form, change)
            # Shown once: only the hash is stored.
            self.message_user(request, f"New API key (copy it now, it will not be shown again): {raw}",
                              messages.WARNING)
            self.message_user(request, f"Its webhook signing secret (shown once too): {obj.webhook_secret}",
                              messages.WARNING)
            return
        super().save_model(request, obj, form, change)
        if "revoked_at" in form.changed_data and obj.revoked_at is not None:  # revoked by hand: as the action
            transaction.on_commit(partial(api_key_revocation_announce, hashed_key=obj.hashed_key))

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = sum(api_key_revoke(api_key_id=key_id) for key_id in queryset.values_list("id", flat=True))
        self.message_user(request, f"Revoked {revoked} key(s).")

    @admin.action(description="Rotate the webhook signing secrets of selected keys")
    def rotate_webhook_secrets(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key_id, prefix in queryset.values_list("id", "prefix"):
            secret = api_key_rotate_webhook_secret(api_key_id=key_id)
            self.message_user(request, f"New webhook secret of {prefix}… (shown once): {secret}", messages.WARNING)


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("day", "api_key", "owner", "requests", "prompt_tokens", "cached_tokens", "completion_tokens")
    list_filter = ("day",)
    search_fields = ("owner__username", "api_key__prefix")
    date_hierarchy = "day"
    actions = ("roll_up_today",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False

    @admin.action(description="Recompute today's usage from the jobs")
    def roll_up_today(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> None:
        count = usage_rollup(day=timezone.now().date())
        self.message_user(request, f"Rolled up {count} key(s) for today.")
