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

from ..errors import AuthError
from ..netio import recv_exact

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
        client_nonce = recv_exact(sock, _NONCE)
        (claim_len,) = struct.unpack("<H", recv_exact(sock, 2))
        if claim_len > _MAX_CLAIM:
            raise AuthError(f"handshake: claim too long (got {claim_len} bytes, at most "
                            f"{_MAX_CLAIM})")
        claim = recv_exact(sock, claim_len)
        answer = recv_exact(sock, _DIGEST)
        if not hmac.compare_digest(answer, _mac(key, b"client", server_nonce, client_nonce, claim)):
            sock.sendall(_REFUSED)
            raise AuthError(f"handshake: wrong HMAC from {claim!r}; the two sides use "
                            "different keys")
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
        hello = recv_exact(sock, len(_MAGIC) + _NONCE)
        if hello[: len(_MAGIC)] != _MAGIC:
            raise AuthError(f"{peer}: did not start an mwrt handshake (got {hello[:9]!r})")
        server_nonce, client_nonce = hello[len(_MAGIC):], secrets.token_bytes(_NONCE)
        proof = _mac(key, b"client", server_nonce, client_nonce, claim)
        sock.sendall(client_nonce + struct.pack("<H", len(claim)) + claim + proof)
        if recv_exact(sock, 1) != _OK:
            raise AuthError(
                f"{peer}: refused the HMAC handshake (a wrong key, or a rank or group it "
                "does not expect); give every rank the same key (MWRT_KEY_FILE)"
            )
        expected = _mac(key, b"server", server_nonce, client_nonce, claim)
        if not hmac.compare_digest(recv_exact(sock, _DIGEST), expected):
            raise AuthError(f"{peer}: could not prove it holds the key; refusing to send to it")
    finally:
        sock.settimeout(previous)


# -- key files and CurveZMQ on the command socket --------------------------------------------
#
# A key file is JSON, readable by its owner only: the holder's CURVE key pair, the public
# keys it trusts (a worker: the masters it admits; a master: the workers' server key), and
# the HMAC key every data-channel connection of the cluster proves it knows.


class KeyFile:
    """One party's secrets: CURVE pair, trusted public keys, cluster HMAC key."""

    def __init__(self, public: bytes, secret: bytes, trusted: list[bytes], hmac_key: bytes,
                 path: str = "<memory>"):
        self.public, self.secret, self.trusted = public, secret, list(trusted)
        self.hmac_key, self.path = hmac_key, path

    def to_json(self) -> str:
        import json

        return json.dumps({"curve_public": self.public.decode(),
                           "curve_secret": self.secret.decode(),
                           "trusted": [k.decode() for k in self.trusted],
                           "hmac": self.hmac_key.hex()})

    def save(self, path: str) -> None:
        """Write with mode 0600 (created so, never world-readable in between)."""
        import os

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
        self.path = path


def load_key_file(path: str) -> KeyFile:
    """Read a key file written by `mwrt-worker keygen`; errors name the file and the field."""
    import json

    from .. import config

    path = config.expand_path(path)  # "~/mwrt-keys/master.key" as the README writes it
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise AuthError(f"key file {path}: cannot read it ({exc.strerror}); create keys with "
                        "`mwrt-worker keygen DIR`") from None
    except ValueError as exc:
        raise AuthError(f"key file {path}: not JSON ({exc})") from None
    check_private(path)
    try:
        keys = KeyFile(data["curve_public"].encode(), data["curve_secret"].encode(),
                       [k.encode() for k in data["trusted"]], bytes.fromhex(data["hmac"]), path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AuthError(f"key file {path}: missing or malformed field ({exc})") from None
    if len(keys.public) != 40 or len(keys.secret) != 40:
        raise AuthError(f"key file {path}: CURVE keys must be 40 Z85 characters")
    return keys


def check_private(path: str) -> None:
    """Refuse a secret key file that others may read or replace, as ssh does, with the fix."""
    import os
    import stat

    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise AuthError(f"key file {path}: others may read or change it (mode {mode:04o}, "
                        f"expected 0600), so its secret is no longer one; run `chmod 600 {path}` "
                        "(and make new keys with `mwrt-worker keygen` if others may have read it)")
    directory = os.path.dirname(os.path.abspath(path))
    dmode = os.stat(directory).st_mode
    if dmode & stat.S_IWOTH and not dmode & stat.S_ISVTX:
        raise AuthError(f"key file {path}: its directory {directory} is writable by anyone "
                        f"(mode {stat.S_IMODE(dmode):04o}), who could replace the key; run "
                        f"`chmod o-w {directory}` or keep keys in a private directory")


def generate_cluster_keys() -> tuple[KeyFile, KeyFile]:
    """A fresh (worker, master) pair of key files that trust each other."""
    import zmq

    worker_public, worker_secret = zmq.curve_keypair()
    master_public, master_secret = zmq.curve_keypair()
    shared = generate_hmac_key()
    return (KeyFile(worker_public, worker_secret, [master_public], shared),
            KeyFile(master_public, master_secret, [worker_public], shared))


def keygen(directory: str) -> tuple[str, str]:
    """Write worker.key and master.key into `directory`; returns their paths."""
    import os

    from .. import config

    directory = config.expand_path(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    worker, master = generate_cluster_keys()
    paths = os.path.join(directory, "worker.key"), os.path.join(directory, "master.key")
    for keys, path in zip((worker, master), paths):
        if os.path.exists(path):
            raise AuthError(f"keygen: {path} exists; remove it or choose another directory")
        keys.save(path)
    return paths


def as_key_file(key) -> KeyFile | None:
    """Accept a KeyFile, a path, or None (then MWRT_KEY_FILE, if set)."""
    from .. import config

    if isinstance(key, KeyFile):
        return key
    if key is None:
        key = config.get("key_file") or None
    return None if key is None else load_key_file(str(key))


def job_secret() -> bytes | None:
    """An SPMD job's HMAC key: MWRT_JOB_SECRET, else MWRT_KEY_FILE's cluster key, else None."""
    from .. import config

    secret = config.get("job_secret")
    if secret:
        return hashlib.sha256(b"mwrt-job-secret:" + secret.encode()).digest()
    keys = as_key_file(None)
    return keys.hmac_key if keys is not None else None


def serve_curve(socket, keys: KeyFile) -> None:
    """Make `socket` a CURVE server; its context's authenticator must admit the masters."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def connect_curve(socket, keys: KeyFile) -> None:
    """Make `socket` a CURVE client of a server whose public key `keys` trusts."""
    if not keys.trusted:
        raise AuthError(f"key file {keys.path}: trusts no worker key")
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = keys.trusted[0]


class MasterAdmission:
    """Admit exactly the masters listed in the worker's key file (the ZAP handler asks, see
    protocol/zap.py); log refusals (the only log line of such a refusal: the daemon's monitor
    leaves these to it)."""

    def __init__(self, keys: KeyFile):
        self.allowed = set(keys.trusted)
        self.refused = 0
        self.logged: set[tuple[str, bytes]] = set()

    def admit(self, key: bytes, peer: str) -> bool:
        """Whether the master at address `peer` with CURVE public key `key` may connect."""
        from zmq.utils import z85

        encoded = z85.encode(key) if len(key) == 32 else key
        if encoded in self.allowed:
            return True
        self.refused += 1
        # A master knocks on two sockets (and retries): one line per peer and key is enough.
        if (peer, encoded) not in self.logged and len(self.logged) < 1024:
            self.logged.add((peer, encoded))
            log.warning("refused a master at %s whose CURVE key is not in the key file "
                        "(key %s...); add its master.key's public key or give it this "
                        "worker's master.key", peer, encoded[:8].decode(errors="replace"))
        return False


def start_authenticator(context, keys: KeyFile):
    """Start the ZAP handler thread that checks masters' keys for `context`'s sockets."""
    from .zap import ZapHandler

    return ZapHandler(context, MasterAdmission(keys))
