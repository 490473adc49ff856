"""Which webhook URLs a job may name: http(s) only, and hosts on the public internet, unless the
operator allows private ranges. Refused at every door with a 400 in the error envelope, and no
job is made."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket

import pytest
from channels.testing import WebsocketCommunicator
from django.core.exceptions import ImproperlyConfigured

from api.models import Job
from api.webhooks.targets import WebhookUrlRefused, webhook_target, webhook_url_check
from inference_service.asgi import application
from inference_service.env import env_networks
from tests.api.factories import make_api_key
from tests.api.openai_api.client import Exchange, request

PUBLIC = "http://93.184.216.34/hooks"

REFUSED = [
    "ftp://93.184.216.34/x",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "not a url",
    "http:///no-host",
    "http://user:pw@93.184.216.34/x",
    "http://127.0.0.1:8000/x",
    "http://localhost/x",  # a name: resolved, to loopback
    "http://10.1.2.3/x",
    "http://192.168.0.10/x",
    "http://172.16.0.1/x",
    "http://169.254.169.254/latest/meta-data",  # the cloud metadata service (link-local)
    "http://100.64.0.1/x",  # carrier-grade NAT
    "http://0.0.0.0/x",
    "http://224.0.0.1/x",  # multicast
    "http://240.0.0.1/x",  # reserved
    "http://[::1]/x",
    "http://[fe80::1]/x",
    "http://[fd00::1]/x",
    "http://[::ffff:127.0.0.1]/x",  # loopback, mapped into IPv6
]


@pytest.mark.parametrize("url", REFUSED)
def test_non_http_and_non_public_urls_are_refused(url):
    with pytest.raises(WebhookUrlRefused) as refused:
        webhook_url_check(url)
    assert refused.value.param == "webhook_url" and refused.value.code == "invalid_webhook_url"
    assert refused.value.status_code == 400


@pytest.mark.parametrize("url", [PUBLIC, "https://93.184.216.34:8443/a?b=c", "https://[2606:4700:4700::1111]/x"])
def test_public_http_and_https_urls_are_accepted(url):
    assert webhook_url_check(url) == url


def test_a_name_is_refused_if_any_of_its_addresses_is_private(monkeypatch):
    def resolve(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(WebhookUrlRefused, match="10.0.0.5"):
        webhook_url_check("https://hooks.example.com/x")


def test_a_name_that_does_not_resolve_is_refused(monkeypatch):
    def resolve(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(WebhookUrlRefused, match="could not be resolved"):
        webhook_url_check("https://nowhere.invalid/x")


def test_allowed_networks_let_their_addresses_through_and_no_others(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)
    assert webhook_url_check("http://127.0.0.1:9000/x")
    assert webhook_url_check("http://localhost:9000/x") if _localhost_is_ipv4_only() else True
    with pytest.raises(WebhookUrlRefused):
        webhook_url_check("http://10.1.2.3/x")


def test_allow_private_lets_every_address_through_but_not_other_schemes(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    assert webhook_url_check("http://10.1.2.3/x")
    assert webhook_url_check("http://[::1]:9000/x")
    with pytest.raises(WebhookUrlRefused):
        webhook_url_check("ftp://10.1.2.3/x")


def test_the_target_pins_the_checked_address_and_keeps_the_host_for_the_host_header(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2606:4700::1111", port, 0, 0))])

    target = webhook_target("https://hooks.example.com:8443/in?x=1")

    assert str(target.pinned_url) == "https://[2606:4700::1111]:8443/in?x=1"
    assert target.host_header == "hooks.example.com:8443"


def test_a_bad_allowed_networks_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("WEBHOOK_ALLOWED_NETWORKS", "10.0.0.0/8,not-a-network")
    with pytest.raises(ImproperlyConfigured, match="WEBHOOK_ALLOWED_NETWORKS"):
        env_networks("WEBHOOK_ALLOWED_NETWORKS", [])


def _localhost_is_ipv4_only() -> bool:
    return {info[4][0] for info in socket.getaddrinfo("localhost", 80)} <= {"127.0.0.1"}


# -- the doors ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_rest_refuses_a_loopback_webhook_with_a_400_envelope_and_makes_no_job(api_client):
    response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4,
                                                "webhook_url": "http://127.0.0.1:9000/x"}, format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_webhook_url", "webhook_url",
                                                              "invalid_request_error")
    assert "private or reserved" in error["message"]
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["ftp://93.184.216.34/x", "", 42])
def test_rest_refuses_a_webhook_that_is_not_an_http_url(api_client, url):
    response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4, "webhook_url": url}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "webhook_url"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_rest_stores_an_accepted_webhook_and_shows_it_with_the_job(api_client):
    created = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4, "webhook_url": PUBLIC},
                              format="json")
    plain = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")

    assert created.status_code == 202
    assert Job.objects.get(id=created.json()["id"]).webhook_url == PUBLIC
    assert api_client.get(f"/api/v1/jobs/{created.json()['id']}").json()["webhook_url"] == PUBLIC
    assert api_client.get(f"/api/v1/jobs/{plain.json()['id']}").json()["webhook_url"] is None


@pytest.mark.django_db
def test_an_idempotent_retry_with_another_webhook_is_a_different_body(api_client):
    body = {"prompt": "Hi", "max_tokens": 4, "webhook_url": PUBLIC}
    first = api_client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    other = api_client.post("/api/v1/jobs", {**body, "webhook_url": PUBLIC + "/2"}, format="json",
                            HTTP_IDEMPOTENCY_KEY="k1")

    assert first.status_code == 202
    assert other.status_code == 422


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_openai_endpoints_take_webhook_url_as_an_extra_field_and_check_it(settings):
    _, secret = make_api_key()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    refused = asyncio.run(request("/v1/chat/completions", {**body, "webhook_url": "http://169.254.169.254/"},
                                  secret=secret))
    settings.WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)

    async def stream_started() -> int:
        exchange = Exchange("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 2, "stream": True,
                                                "webhook_url": "http://127.0.0.1:9/in"}, secret=secret)
        await exchange.send()
        status = (await exchange.start())["status"]
        await exchange.disconnect()
        return status

    assert refused.status == 400
    assert refused.json()["error"]["code"] == "invalid_webhook_url"
    assert asyncio.run(stream_started()) == 200
    assert Job.objects.get().webhook_url == "http://127.0.0.1:9/in"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_the_generate_socket_checks_webhook_url_as_rest_does():
    _, secret = make_api_key()

    async def submit(url: str) -> dict:
        communicator = WebsocketCommunicator(application, f"/ws/v1/generate?api_key={secret}")
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_to(text_data=json.dumps({"prompt": "Hi", "max_tokens": 2, "webhook_url": url}))
        first = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return first

    refused = asyncio.run(submit("http://10.0.0.1/x"))
    accepted = asyncio.run(submit(PUBLIC))

    assert refused["error"]["code"] == "invalid_webhook_url"
    assert accepted["type"] == "job"
    assert Job.objects.get(id=accepted["id"]).webhook_url == PUBLIC
