"""TLS on an acceptor: the context its listening socket holds, certificate reload, certificate logins.

The listening context never changes (asyncio keeps the one `create_server` was given); its
servername callback, which OpenSSL calls on every ClientHello (with or without SNI), swaps in
the newest context built from the files. A reload (the files' modification times changed, seen at
each housekeeping round, or SIGHUP) therefore applies to connections that start their handshake
afterwards; connections already open keep the certificate they were made with. A reload that
fails (a key that does not match its certificate, say while the files are being replaced) keeps
the previous context and logs an error once per change of the files.
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

from ..config import AcceptorConfig, BrokerConfig

log = logging.getLogger("tandem.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def server_context(acc: AcceptorConfig) -> ssl.SSLContext:
    """A server context from the acceptor's settings; raises OSError or ssl.SSLError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[v] for v in acc.enabled_protocols)
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if acc.enabled_cipher_suites:
        ctx.set_ciphers(":".join(acc.enabled_cipher_suites))
    assert acc.cert_path is not None and acc.key_path is not None  # checked with the config
    ctx.load_cert_chain(acc.cert_path, acc.key_path)
    if acc.trust_store_path:
        ctx.load_verify_locations(cafile=acc.trust_store_path)
        ctx.verify_mode = ssl.CERT_REQUIRED if acc.need_client_auth else ssl.CERT_OPTIONAL
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


class AcceptorTls:
    """One acceptor's TLS contexts: `listening` for create_server, reloaded through `reload()`."""

    def __init__(self, acc: AcceptorConfig) -> None:
        self.acc = acc
        self._stamp = self._files_stamp()
        self._failed_stamp: tuple[Any, ...] | None = None
        self.current = server_context(acc)
        self.listening = server_context(acc)
        self.listening.sni_callback = self._pick
        self.reloads = 0

    def _pick(self, obj: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: ssl.SSLContext) -> None:
        obj.context = self.current

    def _files_stamp(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for path in (self.acc.cert_path, self.acc.key_path, self.acc.trust_store_path):
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append((st.st_mtime_ns, st.st_size, st.st_ino) if st else None)
        return tuple(out)

    def reload(self, force: bool = False) -> bool:
        """A new context for new connections when the files changed (or `force`); True if reloaded."""
        stamp = self._files_stamp()
        if not force and stamp == self._stamp:
            return False
        try:
            ctx = server_context(self.acc)
        except (OSError, ssl.SSLError, ValueError) as exc:
            if force or stamp != self._failed_stamp:
                log.error("acceptor %r: TLS files not reloaded, the previous ones stay in use: %s", self.acc.name, exc)
            self._failed_stamp = stamp
            return False
        self.current, self._stamp, self._failed_stamp = ctx, stamp, None
        self.reloads += 1
        log.warning("acceptor %r: TLS certificate reloaded for new connections", self.acc.name)
        return True


def peer_identity(transport: Any) -> tuple[str | None, str] | None:
    """(common name, RFC 4514 subject) of a verified client certificate; None without one."""
    obj = transport.get_extra_info("ssl_object")
    if obj is None or obj.context.verify_mode == ssl.CERT_NONE:
        return None  # unverified certificates are never asked for, and never believed
    der = obj.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    subject = x509.load_der_x509_certificate(der).subject
    cns = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = cns[0].value if cns else None
    return (cn if isinstance(cn, str) else None), subject.rfc4514_string()


def cert_user(config: BrokerConfig, transport: Any) -> str | None:
    """The user `cert-user-mapping` gives the connection's verified client certificate (first match)."""
    if not config.cert_user_mapping:
        return None
    ident = peer_identity(transport)
    if ident is None:
        return None
    cn, subject = ident
    for m in config.cert_user_mapping:
        if m.matches(cn, subject):
            return m.user
    log.info("client certificate %s maps to no user (cert-user-mapping)", subject)
    return None
