"""Keys and the HMAC challenge that every data-channel connection passes first.

The challenge is mutual: the server sends a random nonce, the client answers with
its own nonce, its claim (who it says it is) and HMAC-SHA256(key, "client" | both
nonces | claim); the server checks it with `hmac.compare_digest`, then proves it
holds the key too with HMAC(key, "server" | both nonces | claim). Fresh nonces on
both sides make a recorded exchange useless for a replay. No payload byte is read
before the challenge passes. Without a key both sides use `PUBLIC_KEY`: that still
rejects stray connections (a port scanner, another group) but is not security.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct

from .errors import AuthError

PUBLIC_KEY = b"mwrt-public-key: no secret configured"
_MAGIC = b"MWRTAUTH1"
_NONCE = 32
_DIGEST = 32
_MAX_CLAIM = 1024
_OK, _REFUSED = b"\x01", b"\x00"

log = logging.getLogger("mwrt.channels")


def generate_hmac_key() -> bytes:
    """A fresh random 32-byte key."""
    return secrets.token_bytes(32)


def _mac(key: bytes | None, role: bytes, server_nonce: bytes, client_nonce: bytes,
         claim: bytes) -> bytes:
    msg = role + server_nonce + client_nonce + struct.pack("<H", len(claim)) + claim
    return hmac.new(key or PUBLIC_KEY, msg, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} handshake bytes")
        got += k
    return bytes(buf)


def server_handshake(sock: socket.socket, key: bytes | None, timeout: float,
                     check=None) -> bytes:
    """Challenge the connecting side; return its authenticated claim or raise AuthError.

    `check(claim)`, if given, may raise AuthError to refuse a well-keyed but unwanted peer.
    """
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        server_nonce = secrets.token_bytes(_NONCE)
        sock.sendall(_MAGIC + server_nonce)
        client_nonce = _recv_exact(sock, _NONCE)
        (claim_len,) = struct.unpack("<H", _recv_exact(sock, 2))
        if claim_len > _MAX_CLAIM:
            raise AuthError(f"handshake: claim too long (got {claim_len} bytes, at most {_MAX_CLAIM})")
        claim = _recv_exact(sock, claim_len)
        answer = _recv_exact(sock, _DIGEST)
        if not hmac.compare_digest(answer, _mac(key, b"client", server_nonce, client_nonce, claim)):
            sock.sendall(_REFUSED)
            raise AuthError(f"handshake: wrong HMAC from {claim!r}; the two sides use different keys")
        if check is not None:
            try:
                check(claim)
            except AuthError:
                sock.sendall(_REFUSED)
                raise
        sock.sendall(_OK + _mac(key, b"server", server_nonce, client_nonce, claim))
        return claim
    except (OSError, struct.error) as exc:
        raise AuthError(f"handshake: {type(exc).__name__}: {exc}") from exc
    finally:
        sock.settimeout(previous)


def client_handshake(sock: socket.socket, key: bytes | None, timeout: float, claim: bytes,
                     peer: str = "server") -> None:
    """Answer the server's challenge with `claim`; raise AuthError naming `peer` if refused.

    A connection that breaks without a refusal raises OSError: the peer died, it did not judge.
    """
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello = _recv_exact(sock, len(_MAGIC) + _NONCE)
        if hello[: len(_MAGIC)] != _MAGIC:
            raise AuthError(f"{peer}: did not start an mwrt handshake (got {hello[:9]!r})")
        server_nonce, client_nonce = hello[len(_MAGIC):], secrets.token_bytes(_NONCE)
        proof = _mac(key, b"client", server_nonce, client_nonce, claim)
        sock.sendall(client_nonce + struct.pack("<H", len(claim)) + claim + proof)
        if _recv_exact(sock, 1) != _OK:
            raise AuthError(
                f"{peer}: refused the HMAC handshake (a wrong key, or a rank or group it "
                "does not expect); give every rank the same key (MWRT_KEY_FILE)"
            )
        expected = _mac(key, b"server", server_nonce, client_nonce, claim)
        if not hmac.compare_digest(_recv_exact(sock, _DIGEST), expected):
            raise AuthError(f"{peer}: could not prove it holds the key; refusing to send to it")
    finally:
        sock.settimeout(previous)
