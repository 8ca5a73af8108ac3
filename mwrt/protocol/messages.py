"""Every message between master and worker, one frozen dataclass each.

Commands (master -> worker) come first, then replies; a worker handler has the
command's name. The field order is the wire order; `id` is the command's number and
`stream` (when present) the stream it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- commands: master -> worker -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Hello:
    """Open a session: the worker answers with a Welcome."""

    id: int
    session: str
    master: str
    node: int


@dataclass(frozen=True, slots=True)
class Bye:
    """Close the session and free everything it holds."""

    id: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Liveness probe; the worker answers Pong at once from its socket thread."""

    id: int


@dataclass(frozen=True, slots=True)
class Create:
    """Allocate tensor `out` on `device`: kind in empty/zeros/ones/full/arange/rand/randn."""

    id: int
    stream: int
    out: int
    kind: str
    shape: tuple
    dtype: str
    device: int
    args: tuple


@dataclass(frozen=True, slots=True)
class Put:
    """Tensor `out` from bytes in data frame `frame` (or channel tag when frame < 0)."""

    id: int
    stream: int
    out: int
    shape: tuple
    dtype: str
    device: int
    frame: int


@dataclass(frozen=True, slots=True)
class Call:
    """Run registry op `op` on args (Refs resolved on the worker); results to ids `outs`."""

    id: int
    stream: int
    outs: tuple
    op: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True, slots=True)
class Remote:
    """Run a cloudpickled user function; array results become tensors `outs`."""

    id: int
    stream: int
    outs: tuple
    fn: bytes
    args: tuple
    kwargs: dict


@dataclass(frozen=True, slots=True)
class Free:
    """Drop tensors `ids` once `uses` streams (each sent this Free) have reached it."""

    id: int
    stream: int
    ids: tuple
    uses: int


@dataclass(frozen=True, slots=True)
class Get:
    """Send tensor `ref`'s bytes back once `stream` reaches this point."""

    id: int
    stream: int
    ref: int
    token: int


@dataclass(frozen=True, slots=True)
class Meta:
    """Report tensor `ref`'s shape and dtype once `stream` reaches this point."""

    id: int
    stream: int
    ref: int
    token: int


@dataclass(frozen=True, slots=True)
class Sync:
    """Answer once `stream` reaches this point (raising its sticky error, if any)."""

    id: int
    stream: int
    token: int


@dataclass(frozen=True, slots=True)
class Query:
    """Answer at once whether `stream` has finished everything issued before this."""

    id: int
    stream: int
    token: int


@dataclass(frozen=True, slots=True)
class NewStream:
    """Create stream `stream` on `device`, with its own executor."""

    id: int
    stream: int
    device: int


@dataclass(frozen=True, slots=True)
class Record:
    """Mark event `event` done when `stream` reaches this point (timing if asked)."""

    id: int
    stream: int
    event: int
    timing: bool


@dataclass(frozen=True, slots=True)
class WaitEvent:
    """Hold `stream` until event `event` is done; `remote` events are relayed by the master."""

    id: int
    stream: int
    event: int


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Answer whether event `event` is done; with `wait`, answer once it is."""

    id: int
    event: int
    wait: bool
    token: int


@dataclass(frozen=True, slots=True)
class EventDone:
    """Relay: event `event` (recorded on another node) is done, or will never be (`error`)."""

    id: int
    event: int
    error: str


@dataclass(frozen=True, slots=True)
class Profile:
    """Start (`on`) or stop recording a timeline of this session; stopping answers with it."""

    id: int
    on: bool
    token: int


@dataclass(frozen=True, slots=True)
class Join:
    """The session's data channel: rendezvous store, key prefix, size, channel name.

    The master is the last rank (`world` - 1); node i is rank i. The worker joins off its
    socket thread, so a store it cannot reach never stalls its other masters.
    """

    id: int
    store: str
    prefix: str
    world: int
    channel: str
    timeout: float  # seconds the worker tries to reach the store: the master's to choose
    token: int  # answered (Done, or Failed naming what it could not reach) once joined


@dataclass(frozen=True, slots=True)
class SendTo:
    """Send tensor `ref` to channel rank `peer` with `tag`; token >= 0: say Done first."""

    id: int
    stream: int
    ref: int
    peer: int
    tag: int
    token: int


@dataclass(frozen=True, slots=True)
class RecvFrom:
    """Receive tensor `out` (shape, dtype, device) from channel rank `peer` with `tag`.

    The receive is posted when the command arrives; token >= 0: say Done once posted, so
    the sender's bytes land in place instead of a stash.
    """

    id: int
    stream: int
    out: int
    shape: tuple
    dtype: str
    device: int
    peer: int
    tag: int
    token: int


@dataclass(frozen=True, slots=True)
class Collective:
    """Run collective `kind` over the nodes `ranks` (group `group`) on tensor `ref`.

    `args` holds the collective's options (op, root); `out`, when not -1, names a new
    tensor of `out_shape` for collectives that make one (all_gather, gather, scatter).
    """

    id: int
    stream: int
    kind: str
    group: int
    ranks: tuple
    ref: int
    args: dict
    out: int
    out_shape: tuple


@dataclass(frozen=True, slots=True)
class Stats:
    """Report live tensors and bytes of this session."""

    id: int
    token: int


# -- replies: worker -> master --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Welcome:
    """Answer to Hello: who the worker is."""

    token: int
    incarnation: str
    hostname: str
    pid: int
    devices: int
    data_address: str


@dataclass(frozen=True, slots=True)
class Pong:
    """Answer to Ping."""

    token: int
    incarnation: str


@dataclass(frozen=True, slots=True)
class Done:
    """A sync point was reached; `value` is the answer (None, bool, dict)."""

    token: int
    value: object


@dataclass(frozen=True, slots=True)
class Data:
    """A tensor's bytes: in data frame 0."""

    token: int
    shape: tuple
    dtype: str


@dataclass(frozen=True, slots=True)
class Failed:
    """An error: `info` holds kind, message, node, device, stream, op, shapes, traceback."""

    token: int
    info: dict


@dataclass(frozen=True, slots=True)
class Fired:
    """Event `event` (one another node waits on) is done; the master relays it."""

    token: int
    event: int
    time: float


@dataclass(frozen=True, slots=True)
class PeerLost:
    """Node `rank` is gone (`reason`): fail every receive from it on the data channel now."""

    id: int
    rank: int
    reason: str


# The wire code of a message is its index here: append, never reorder.
MESSAGES = [Hello, Bye, Ping, Create, Put, Call, Remote, Free, Get, Meta, Sync, Query,
            NewStream, Record, WaitEvent, EventQuery, EventDone, Profile, Join, SendTo, RecvFrom,
            Collective, Stats,
            Welcome, Pong, Done, Data, Failed, Fired, PeerLost]
