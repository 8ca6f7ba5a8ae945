"""Real TLS for the network tests: a ``trustme`` CA and certificates written to files, and a webhook
receiver (an ASGI app on uvicorn over HTTPS on loopback) that records every request."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
import uvicorn
from standardwebhooks import Webhook

from broker.testing.polling import eventually
from tests.front_support import free_port


@dataclass
class Certificates:
    """A CA (``ca``, its PEM at ``ca_file``) and a server certificate for localhost / 127.0.0.1."""

    ca: trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting only this CA."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def client_identity(self, tmp: Path, name: str = "agent.example") -> Path:
        """A client certificate (with its key) in one PEM file, for mutual TLS."""
        path = tmp / f"client-{name}.pem"
        self.ca.issue_cert(name).private_key_and_cert_chain_pem.write_to_path(str(path))
        return path


def certificates(tmp: Path) -> Certificates:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    ca_file, cert_file, key_file = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca.cert_pem.write_to_path(str(ca_file))
    server.cert_chain_pems[0].write_to_path(str(cert_file))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_file), append=True)
    server.private_key_pem.write_to_path(str(key_file))
    return Certificates(ca, ca_file, cert_file, key_file)


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes

    def verified(self, secret: str) -> dict[str, Any]:
        """The body, once its Standard Webhooks signature verifies with ``secret`` (raises if not)."""
        data = Webhook(secret).verify(self.body, self.headers)
        assert isinstance(data, dict)
        return data


@dataclass
class Receiver:
    """Records every POST; answers ``statuses`` in turn (then 204). While ``gate`` is set to an unset
    event, requests wait for it before answering (a slow endpoint)."""

    url: str = ""
    deliveries: list[Delivery] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    gate: asyncio.Event | None = None
    location: str = ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.deliveries.append(Delivery(headers, body))
        if self.gate is not None:
            await self.gate.wait()
        status = self.statuses.pop(0) if self.statuses else 204
        # No keep-alive: an idle TLS connection held by relay would hold the receiver's shutdown.
        headers = [(b"connection", b"close")]
        if self.location:
            headers.append((b"location", self.location.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def for_agent(self, agent: str) -> list[Delivery]:
        return [d for d in self.deliveries if f'"agent":"{agent}"'.encode() in d.body]


@contextlib.asynccontextmanager
async def receiver(certs: Certificates, host: str = "127.0.0.1") -> AsyncIterator[Receiver]:
    """A webhook receiver over HTTPS on a free loopback port; its ``url`` ends in /hook."""
    found = Receiver()
    port = free_port()
    config = uvicorn.Config(
        found,
        host="127.0.0.1",
        port=port,
        ssl_certfile=str(certs.cert_file),
        ssl_keyfile=str(certs.key_file),
        log_config=None,
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), 10, "receiver started")
        found.url = f"https://{host}:{port}/hook"
        yield found
    finally:
        if found.gate is not None:
            found.gate.set()
        server.should_exit = True
        await asyncio.wait_for(task, 15)
