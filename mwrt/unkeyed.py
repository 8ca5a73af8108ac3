"""One policy for listeners without a secret: loopback always, beyond it only on request.

A data channel, a store or a launched job with no secret admits anyone who reaches its port,
so it stays on loopback unless MWRT_INSECURE=1 says the network is private (logged once per
kind of listener). Every refusal ends with the same fix, written here once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from . import config
from .errors import ConfigError
from .netaddr import is_loopback

log = logging.getLogger("mwrt.security")

FIX = ("set MWRT_JOB_SECRET to the same value on every rank (or MWRT_KEY_FILE to a key file "
       "from `mwrt-worker keygen`), or MWRT_INSECURE=1 on a private network")

_warned: set[str] = set()  # the kinds of listener already logged as insecure


def insecure(environ: Mapping[str, str] | None = None) -> bool:
    """Whether MWRT_INSECURE=1 is set in this process (or in `environ`, a launched rank's)."""
    if environ is None:
        return bool(config.get("insecure"))
    return environ.get(config.SETTINGS["insecure"].env, "") not in ("", "0")


def may_listen(host: str, key: object, what: str, risk: str) -> bool:
    """Whether `what` may use `host`: with a key or on loopback always; beyond loopback only
    under MWRT_INSECURE=1 (`risk`, what a stranger could do, is logged once per `what`)."""
    if key is not None or is_loopback(host):
        return True
    if not insecure():
        return False
    if what not in _warned:
        _warned.add(what)
        log.warning("MWRT_INSECURE=1: %s at %s has no secret; anyone who reaches it %s",
                    what, host, risk)
    return True


def refusal(what: str, host: str, risk: str, verb: str = "listen on") -> ConfigError:
    """The error for an unkeyed `what` beyond loopback at `host`, with the fix."""
    return ConfigError(f"{what}: this job has no secret, so it will not {verb} {host} "
                       f"(beyond loopback, where anyone who reaches the port {risk}); {FIX}")
