"""`keel serve`'s web app: A2A (JSON-RPC and HTTP+JSON, the `a2a-sdk`'s routes over Keel's
request handler), the agent card, and whatever other protocol's routes are handed in, all
behind one door (ADR 0040). Spec 1.0 and 0.3 are served side by side on the same paths (the
SDK's compat layer, `a2a.compat.v0_3`): a 0.3 method (`message/send`, `tasks/get`, REST's
`/v1/...`) is answered as 0.3, and a request without the `A2A-Version` header is 0.3 by the
spec, so a 0.3 client that sends none is answered (issue 37). The card carries both versions'
fields, skills with their input and output modes (strict clients require them):

- with a token, a bearer check on every request but the agent card's (a client reads the card
  to learn it must send one): a request without the token gets 401 before any handler runs,
  so it records nothing; clients may then use any name for this machine (a proxy's, a
  service's);
- without one (loopback only), the Host guard of `keel ui`: a page elsewhere cannot reach the
  server through DNS rebinding, since a browser sends that page's host name;
- with or without one, `doors.CrossSiteGuard`: a request that acts, sent by another site's page
  (its `Origin`), or with a body that is not JSON, is refused; an A2A body past 4 MiB too
  (ADR 0047).

Runs go on in this process's event loop (`runs.RunService`); at start the served runs a killed
server left behind are taken up, at shutdown the running ones stop after their step, saved.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Collection, Sequence

from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_CURRENT,
)
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from keel.serve.a2a_handler import KeelRequestHandler
from keel.serve.doors import CrossSiteGuard
from keel.serve.fasta2a_dialect import Fasta2aDialect
from keel.serve.runs import RunService
from keel.ui.security import Guard

__all__ = ["JSONRPC_PATH", "REST_PATH", "BearerGuard", "agent_card", "build_app"]

JSONRPC_PATH = "/a2a/jsonrpc"
REST_PATH = "/a2a/rest"
OPEN_PATHS = frozenset({AGENT_CARD_WELL_KNOWN_PATH})
"""Read without the token: the card, which says a token is needed and holds no run."""
SCHEME = "bearer"
JSONRPC_LOGGER = "a2a.server.routes.jsonrpc_dispatcher"


class BearerGuard:
    """ASGI middleware: `Authorization: Bearer TOKEN` on every request but the card's."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"www-authenticate", b'Bearer realm="keel serve"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"a bearer token is required\n"})

    def _allowed(self, scope: Scope) -> bool:
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                kind, _, given = bytes(value).partition(b" ")
                return kind.lower() == SCHEME.encode() and hmac.compare_digest(
                    given.strip(), self.token
                )
        return False


class OneLine(logging.Filter):
    """Drops the SDK's traceback for a request it could not parse: its own warning after it
    ("Request Error (ID: 1): Code=-32602, ...") already says what was wrong, in one line, and
    a client's malformed JSON is no fault of this server's."""

    SAID = frozenset({"Failed to validate base JSON-RPC request", "Failed to parse request params"})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.msg in self.SAID)


def quiet_parse_errors() -> None:
    """Install `OneLine` on the SDK's JSON-RPC dispatcher's logger (once)."""
    logger = logging.getLogger(JSONRPC_LOGGER)
    if not any(isinstance(f, OneLine) for f in logger.filters):
        logger.addFilter(OneLine())


def a2a_binding(path: str) -> str | None:
    """The A2A binding a path belongs to (its body capped by `CrossSiteGuard`), or None."""
    if path in (JSONRPC_PATH, JSONRPC_PATH + "/"):
        return "jsonrpc"
    if path.startswith(REST_PATH + "/"):
        return "rest"
    return None


DECIDING = (
    " A task that waits for approval (input-required) is decided by a reply to it: a data part "
    '{"keel_decisions": [{"call_id": ..., "approve": true}]}, or, when one call waits, the text '
    "approve, yes, deny, no, or deny: REASON (an ADK client: a function response "
    '{"result": "approve"} or {"approved": true}).'
)
"""How a paused task is decided, said in the card (a client reads no README)."""
INPUT_MODES = ["text/plain", "application/json"]
OUTPUT_MODES = ["text/markdown", "application/json"]


def agent_card(base_url: str, description: str, *, token: bool) -> AgentCard:
    """What Keel really offers: streaming, yes; push notifications, no (not implemented).
    Each binding is listed for 1.0 and for 0.3 (the same URL answers both)."""
    card = AgentCard(
        name="Keel research agent",
        description=description + DECIDING,
        version="1.0",
        supported_interfaces=[
            AgentInterface(url=base_url + path, protocol_binding=binding, protocol_version=v)
            for v in (PROTOCOL_VERSION_CURRENT, PROTOCOL_VERSION_0_3)
            for path, binding in ((JSONRPC_PATH, "JSONRPC"), (REST_PATH, "HTTP+JSON"))
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=INPUT_MODES,
        default_output_modes=OUTPUT_MODES,
        skills=[
            AgentSkill(
                id="research",
                name="Research a question",
                description="Answers a question from the repository and the web with evidence; "
                "side-effecting calls wait for approval (input-required), and every run ends "
                "in an answer, a classified failure, or a durable pause.",
                tags=["research", "approvals", "durable"],
                examples=["Which modules does the run loop import?"],
                input_modes=INPUT_MODES,
                output_modes=OUTPUT_MODES,
            )
        ],
    )
    if token:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        card.security_requirements.append(
            SecurityRequirement(schemes={"bearer": StringList(list=[])})
        )
    return card


def build_app(
    service: RunService,
    *,
    base_url: str,
    hosts: Collection[str],
    token: str | None,
    extra_routes: Sequence[BaseRoute] = (),
    description: str = "A Keel agent: research runs that never end abruptly or lose work.",
    on_ready: Callable[[], None] = lambda: None,
) -> Starlette:
    """The app; `extra_routes` (another protocol's endpoints) sit behind the same guards.
    `on_ready` is called once the runs left behind are taken up and requests are served."""
    handler = KeelRequestHandler(service)
    quiet_parse_errors()
    card = agent_card(base_url, description, token=token is not None)
    routes: list[BaseRoute] = [
        *extra_routes,
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, JSONRPC_PATH, enable_v0_3_compat=True),
        # fasta2a's client posts to the card's URL with "/" after it (serve/fasta2a_dialect.py)
        *create_jsonrpc_routes(handler, JSONRPC_PATH + "/", enable_v0_3_compat=True),
        *create_rest_routes(handler, path_prefix=REST_PATH, enable_v0_3_compat=True),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.recover()
        on_ready()
        try:
            yield
        finally:
            service.close()
            await service.wait_stopped()

    cross_site = Middleware(CrossSiteGuard, capped=a2a_binding)  # a page elsewhere: refused
    if token is None:  # loopback: a page elsewhere could reach it under a rebound name
        middleware = [Middleware(Guard, hosts=hosts), cross_site]
    else:  # the token is the door: any name the clients use for this machine will do
        middleware = [cross_site, Middleware(BearerGuard, token=token)]
    jsonrpc = frozenset({JSONRPC_PATH, JSONRPC_PATH + "/"})  # innermost: bodies read, guarded
    middleware.append(Middleware(Fasta2aDialect, paths=jsonrpc, fasta2a_path=JSONRPC_PATH + "/"))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.service = service
    return app
