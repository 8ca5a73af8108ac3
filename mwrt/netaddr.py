"""Where this process is on the network: host:port parsing, loopback checks, the address a
listener advertises to its peers, and which processes share a host.

A listener binds where it is told and advertises an address its peers can reach. Told
nothing, it takes the address of the interface that routes to the party every peer
already reaches (the master's store, as gloo derives it from the rendezvous host);
`MWRT_ADVERTISE_ADDR` or `MWRT_IFNAME` (an interface name, as `GLOO_SOCKET_IFNAME`)
override that. Loopback is advertised only when that party is on loopback too, or
unknown (a file:// store): never a guess at an interface.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import os
import socket
import struct

from . import config
from .errors import ConfigError

LOOPBACK = "127.0.0.1"
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def split_host_port(address: str, what: str = "address") -> tuple[str, int]:
    """'host:port', '[v6]:port' or 'tcp://host:port' -> (host, port), with a clear error."""
    text = address[len("tcp://"):] if isinstance(address, str) and \
        address.startswith("tcp://") else address
    host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{what}: expected host:port or tcp://host:port (got {address!r})")
    return host, int(port)


def join_host_port(host: str, port: int | str) -> str:
    """The text form peers parse back with split_host_port: IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1, and names that resolve to them only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def resolve(host: str, what: str) -> str:
    """`host` as an IP address; an unresolvable name fails at once, naming it."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror as exc:
        raise ConfigError(f"{what}: cannot resolve host name {host!r} ({exc.strerror}); use "
                          "an IP address or a name in DNS or /etc/hosts") from None


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface `ifname` (as `ip addr` shows it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", ifname.encode()[:15]))
        except OSError as exc:
            names = ", ".join(name for _, name in socket.if_nameindex())
            raise ConfigError(f"MWRT_IFNAME: interface {ifname!r} has no IPv4 address here "
                              f"({exc.strerror}; interfaces: {names})") from None
    return socket.inet_ntoa(packed[20:24])


def route_source(toward: str) -> str:
    """The local address the kernel would send from to reach `toward` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in toward else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((toward, 9))  # a UDP connect only looks up the route
        except OSError as exc:
            raise ConfigError(f"network: no route from this host to {toward} ({exc.strerror});"
                              " set MWRT_IFNAME to the interface that reaches it") from None
        return sock.getsockname()[0]


def advertise_address(toward: str | None = None, given: str | None = None) -> str:
    """The address this process's listeners advertise: `given`, else MWRT_ADVERTISE_ADDR,
    else MWRT_IFNAME's, else the one routing to `toward`; loopback when `toward` is loopback
    or unknown (a file store has no host to route toward: name the interface there)."""
    given = given or config.get("advertise_addr")
    if given:
        return resolve(given, "MWRT_ADVERTISE_ADDR")
    ifname = config.get("ifname")
    if ifname:
        return interface_address(ifname)
    if toward in (None, "", "0.0.0.0", "::") or is_loopback(toward):
        return LOOPBACK
    return route_source(resolve(toward, "address"))


def bind_listener(sock: socket.socket, host: str, port: int, what: str) -> None:
    """Bind `sock` to host:port; an address that is not this host's (NAT, a container's
    published address) binds every interface instead; a port in use names the port."""
    try:
        sock.bind((host, port))
        return
    except OSError as exc:
        if exc.errno == 99 and host not in ("0.0.0.0", "::"):  # EADDRNOTAVAIL
            sock.bind(("::" if ":" in host else "0.0.0.0", port))
            return
        raise ConfigError(f"{what}: cannot listen on {join_host_port(host, port)} "
                          f"({exc.strerror})") from None


@functools.cache
def host_identity() -> str:
    """Who shares this host: hostname, boot id, the /dev/shm filesystem, the network
    namespace (the shm channel's sockets are abstract UNIX sockets, which live in one) and
    the pid namespace (where a pid, which the shm channel checks a peer's segments by and
    reads its memory by, names the same process). Two processes with equal identities can
    hand each other shared memory, and read each other's by pid where the kernel allows."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    parts = [socket.gethostname(), boot]
    for path in ("/dev/shm", "/proc/self/ns/net", "/proc/self/ns/pid"):
        try:
            st = os.stat(path)
            parts.append(f"{st.st_dev}:{st.st_ino}")
        except OSError:
            parts.append("?")
    return "/".join(parts)
