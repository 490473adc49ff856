"""A webhook receiver for trying the service locally: prints each delivery, checked against
WEBHOOK_SECRET (the signing secret ``make run`` prints), and answers 200.

    WEBHOOK_SECRET=whsec_... .venv/bin/python scripts/webhook_receiver.py 9000

then name ``"webhook_url": "http://127.0.0.1:9000/"`` in a job or a batch (``make run`` allows
loopback receivers when it serves on loopback)."""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        secret = os.environ.get("WEBHOOK_SECRET", "")
        try:
            event = Webhook(secret).verify(body, dict(self.headers)) if secret else json.loads(body)
            check = "signature verified" if secret else "signature not checked (no WEBHOOK_SECRET)"
        except WebhookVerificationError as exc:
            event, check = json.loads(body), f"SIGNATURE REFUSED: {exc}"
        data = event.get("data", {})
        print(f"{event.get('type')} {data.get('id')} status={data.get('status')} ({check})", flush=True)
        print(json.dumps(data, indent=2)[:2000], flush=True)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    print(f"receiving webhooks on http://127.0.0.1:{port}/", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
