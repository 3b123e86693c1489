"""The management listener: an aiohttp application on the broker's own event loop.

Started with the broker's acceptors and stopped with them (server/broker.py), so a waiting
backup answers too (its overview says so; operations that need an active server answer 503).
Each request becomes a call of the broker's `Admin.handle`, the code path of the CLI's MANAGE
packets, with the request as the caller: the same permission checks, the same audit lines.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..config import ManagementConfig, is_loopback_host, parse_host_port
from ..core.permissions import Access
from ..errors import CallTimeout, IllegalState, InvalidArgument, TandemError, Unauthorized
from ..server.audit import audit
from ..server.authorization import access_for
from ..server.security import ANONYMOUS, Subject
from ..server.tls import AcceptorTls, cert_user
from . import auth, metrics
from .console import add_console, is_console_path
from .errors import error_response, from_tandem, json_response
from .routes import ROUTES, Route

if TYPE_CHECKING:
    from ..server.context import BrokerContext

log = logging.getLogger("tandem.management")

OP_TIMEOUT = 30.0  # s an operation may take to answer (one waiting for the disk, for ZooKeeper)
MAX_BODY = 1024 * 1024  # bytes of a request body
SHUTDOWN_TIMEOUT = 2.0  # s requests in progress get when the broker stops
# What answers without a login when security is on; everything else needs one.
PUBLIC_PATHS = frozenset({"/api/login", "/api/logout"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class HttpCaller:
    """An HTTP request as a management caller (server/admin.py `Caller`)."""

    subject: Subject | None
    peer: str
    access: Access | None
    protocol: str = "http"


def _peer(request: web.Request) -> str:
    peername = request.transport.get_extra_info("peername") if request.transport is not None else None
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return request.remote or "?"


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """No version in a Server header; API answers are not cached nor sniffed as another type."""
    response.headers["Server"] = "tandem"
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"


class ManagementServer:
    """The `[management]` listener of one broker."""

    def __init__(self, broker: BrokerContext, config: ManagementConfig) -> None:
        self.broker = broker
        self.config = config
        host, self.port = parse_host_port(config.bind)
        self.host = host
        self.loopback = is_loopback_host(host)
        self.tls: AcceptorTls | None = None
        self.bound: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self.security = broker.config.security_enabled
        self.sessions = auth.Sessions(config.session_timeout / 1000)
        self.app = self.build_app()

    @property
    def scheme(self) -> str:
        return "https" if self.config.ssl_enabled else "http"

    # ------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._authenticate], client_max_size=MAX_BODY)
        app.on_response_prepare.append(_headers)
        app.router.add_post("/api/login", self._login)
        app.router.add_post("/api/logout", self._logout)
        app.router.add_get("/api/whoami", self._whoami)
        for route in ROUTES:
            app.router.add_route(route.method, route.path, self._handler(route))
        metrics.add_route(app, self)  # GET /metrics (management/metrics.py)
        add_console(app)
        return app

    async def start(self) -> None:
        ssl_context: ssl.SSLContext | None = None
        if self.security and not self.loopback and not self.config.ssl_enabled:
            log.warning(
                "[management] listens on %s without TLS: logins and HTTP basic are refused there (a password "
                "would cross the network in clear); set ssl-enabled",
                self.config.bind,
            )
        if self.config.ssl_enabled:
            try:
                self.tls = AcceptorTls(self.config.tls_acceptor())
            except (OSError, ssl.SSLError) as exc:
                raise IllegalState(f"[management]: cannot load its TLS files: {exc}") from None
            ssl_context = self.tls.listening
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=ssl_context, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise IllegalState(f"[management] cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self._runner = runner
        addr = runner.addresses[0]
        self.bound = (addr[0], addr[1])
        log.info("management listening", extra={"bind": f"{addr[0]}:{addr[1]}", "scheme": self.scheme})

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def url(self) -> str | None:
        """Where it listens, as a URL (None before it does)."""
        if self.bound is None:
            return None
        host, port = self.bound
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}"

    def reload_tls(self, force: bool = False) -> None:
        if self.tls is not None:
            self.tls.reload(force)

    # ------------------------------------------------------------- requests
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure as JSON with a code: ours by their ErrorCode, aiohttp's by their status."""
        try:
            return await handler(request)
        except TandemError as exc:
            return from_tandem(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "FRAME_TOO_LARGE"}.get(exc.status, "PROTOCOL")
            return error_response(exc.status, code, exc.reason)
        except Exception:
            log.exception("management request %s %s failed", request.method, request.path)
            return error_response(500, "INTERNAL", "internal error (see the broker's log)")

    # -------------------------------------------------------- authentication
    def _passwords_allowed(self) -> bool:
        """A password may be sent here: over TLS, or to a listener only this machine reaches."""
        return self.config.ssl_enabled or self.loopback

    def _refused(self, request: web.Request, message: str) -> web.Response:
        """401: not logged in. The Basic challenge makes a browser ask for a password; the
        console (which sends X-Requested-With) shows its own login page instead."""
        headers = {} if "X-Requested-With" in request.headers else {"WWW-Authenticate": 'Basic realm="tandem"'}
        return error_response(401, "UNAUTHORIZED", message, headers)

    def _cert_user(self, request: web.Request) -> str | None:
        if self.tls is None or request.transport is None:
            return None
        return cert_user(self.broker.config, request.transport)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Sets request["caller"] on every API request, or answers 401/403 itself."""
        peer = _peer(request)
        headers = request.headers
        if auth.cross_site(request.method, headers.get("Host"), headers.get("Origin"), headers.get("Sec-Fetch-Site")):
            raise Unauthorized("a change sent from another site's page is refused (its Origin is not this listener)")
        if not self.security and self.loopback:
            # Nobody logs in here: a page of another site must not reach it by a name of its own
            # that resolves to 127.0.0.1 (DNS rebinding); this machine's loopback names only.
            host = auth.host_name(headers.get("Host", ""))
            if host and not is_loopback_host(host):
                raise Unauthorized(f"Host {host!r} is not a loopback name: this listener answers loopback names only")
        if not self.security:
            request["caller"] = HttpCaller(ANONYMOUS, peer, None)
            return await handler(request)
        if request.path in PUBLIC_PATHS or is_console_path(request.path):
            return await handler(request)
        header = request.headers.get("Authorization")
        if header is not None:
            creds = auth.basic_credentials(header)
            if creds is None:
                return self._refused(request, "the Authorization header is not HTTP basic")
            if not self._passwords_allowed():
                raise Unauthorized("HTTP basic is refused without TLS on a network address: use https")
            subject = await self.broker.authenticate(creds[0], creds[1], peer, "http")
            if subject is None:
                audit("login", None, peer, None, False, login=creds[0], protocol="http")
                return self._refused(request, "wrong user name or password")
        elif (cert := self._cert_user(request)) is not None and auth.COOKIE not in request.cookies:
            # A verified client certificate that cert-user-mapping maps to a user (mutual TLS):
            # that user, no password; a browser's cookie, when there is one, says who instead.
            found = self.broker.authenticator.subject_for(cert)
            if found is None:
                return self._refused(request, f"the client certificate maps to {cert!r}, who is not a user")
            subject = found
        else:
            token = request.cookies.get(auth.COOKIE)
            session = self.sessions.get(token) if token else None
            if session is None:
                return self._refused(request, "not logged in: POST /api/login, or HTTP basic")
            found = self.broker.authenticator.subject_for(session.user)
            if found is None:  # removed from the users file since
                assert token is not None
                self.sessions.drop(token)
                return self._refused(request, f"user {session.user!r} no longer exists")
            subject = found
            if request.method not in auth.SAFE_METHODS and not auth.csrf_ok(
                session, request.headers.get(auth.CSRF_HEADER)
            ):
                raise Unauthorized(f"a change made with the session cookie needs the {auth.CSRF_HEADER} header")
        request["caller"] = HttpCaller(subject, peer, access_for(self.broker.authorizer, subject, peer))
        return await handler(request)

    async def _login(self, request: web.Request) -> web.Response:
        """`POST /api/login {"username", "password"}`: a session cookie and its CSRF token."""
        if not self.security:
            return json_response({"user": None, "roles": [], "csrf": None, "security": False})
        try:
            body = await request.json()
        except ValueError:
            raise InvalidArgument("the body is not valid JSON") from None
        user = body.get("username") if isinstance(body, dict) else None
        password = body.get("password") if isinstance(body, dict) else None
        if not isinstance(user, str) or not isinstance(password, str):
            raise InvalidArgument('login takes {"username": "...", "password": "..."}')
        if not self._passwords_allowed():
            raise Unauthorized("login is refused without TLS on a network address: use https")
        peer = _peer(request)
        subject = await self.broker.authenticate(user, password, peer, "http")
        if subject is None:
            audit("login", None, peer, None, False, login=user, protocol="http")
            return self._refused(request, "wrong user name or password")
        if subject.cluster or subject.user is None:
            audit("login", subject, peer, None, False, protocol="http")
            raise Unauthorized("the cluster pair is for server-to-server links: log in as a user")
        audit("login", subject, peer, None, True, protocol="http")
        token, session = self.sessions.create(subject.user)
        response = json_response(
            {"user": subject.user, "roles": sorted(subject.roles), "csrf": session.csrf, "security": True}
        )
        response.set_cookie(
            auth.COOKIE, token, httponly=True, samesite="Strict", secure=self.config.ssl_enabled, path="/"
        )
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        token = request.cookies.get(auth.COOKIE)
        if token:
            self.sessions.drop(token)
        response = json_response({"logged_out": bool(token)})
        response.del_cookie(auth.COOKIE, path="/")
        return response

    async def _whoami(self, request: web.Request) -> web.Response:
        """Who this request is: the console asks after a reload (its CSRF token is in memory only)."""
        caller: HttpCaller = request["caller"]
        token = request.cookies.get(auth.COOKIE)
        session = self.sessions.get(token) if token and "Authorization" not in request.headers else None
        subject = caller.subject
        return json_response(
            {
                "user": subject.user if subject is not None else None,
                "roles": sorted(subject.roles) if subject is not None else [],
                "csrf": session.csrf if session is not None else None,
                "security": self.security,
            }
        )

    # ------------------------------------------------------------ operations
    def _handler(self, route: Route) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            caller: HttpCaller = request["caller"]
            body: Any = None
            if route.body and request.can_read_body:
                try:
                    body = await request.json()
                except ValueError:
                    raise InvalidArgument("the body is not valid JSON") from None
            query: dict[str, str] = {}
            for key, value in request.query.items():
                if key in query:
                    raise InvalidArgument(f"query parameter `{key}` given twice")
                query[key] = value
            args = route.args(request.match_info, query, body)
            result = await self.call(route.op, args, caller)
            return json_response(route.shape(result) if route.shape is not None else result)

        return handle

    async def call(self, op: str, args: dict[str, Any], caller: HttpCaller) -> Any:
        """Run `op` through the broker's Admin and wait for its answer (bounded)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def reply(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        self.broker.admin.handle(op, args, caller, reply)
        try:
            return await asyncio.wait_for(fut, OP_TIMEOUT)
        except TimeoutError:
            raise CallTimeout(f"{op} did not answer within {OP_TIMEOUT:.0f} s") from None
