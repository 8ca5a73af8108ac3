"""Every message between master and worker, defined once, here (its kind, traits and the
protocol's constants are message_kinds.py's, re-exported).

The master builds these messages and the worker decodes them into the same classes. Each is
a frozen msgspec Struct packed as the array `[code, *fields]` (its code is its struct tag):
building one costs about what a tuple does, and the encoder needs no hook for it. The field
order is the wire order; `id` is a command's number, `stream` (when present) the stream it
runs on, `token` the number its answer carries. A field's type is what the decoder checks:
a `tuple[int, ...]` arrives as a tuple of ints, a bare tuple, dict or object may hold any
value the wire carries (wire.py), its arrays as tuples.

What the daemon does with a command is read from its traits (class attributes), not
from lists of codes kept elsewhere; a worker handler has the command's name in snake case.
"""

# No `from __future__ import annotations`: msgspec reads each field's type as an object,
# where a string costs it an eval() (1,700 of them: ~30 ms of every process's start).
import re

import msgspec

from .message_kinds import *  # noqa: F403  (the constants and traits, as wire.TRAITS etc.)
from .message_kinds import Command, Message, Reply, StreamCommand

# -- commands answered on the daemon's socket thread ----------------------------------------

class Hello(Command, tag=0, frozen=True):
    """Open a session: the worker answers with a Welcome."""

    socket = "rx"
    session: str
    master: str
    node: int
    # Seconds the worker keeps this session after the master goes silent, for a master of
    # the same named session to re-attach (0: freed after the lease, as any session).
    grace: float = 0.0


class Bye(Command, tag=1, frozen=True):
    """Close the session and free everything it holds."""


class Ping(Command, tag=2, frozen=True):
    """Liveness probe; the worker answers Pong at once from its socket thread."""

    socket = "hb"


class Query(Command, tag=11, frozen=True):
    """Answer at once whether `stream` has finished everything issued before this."""

    stream: int
    token: int


class NewStream(Command, tag=12, frozen=True):
    """Create stream `stream` on `device`, with its own executor."""

    stream: int
    device: int


class EventQuery(Command, tag=15, frozen=True):
    """Answer whether event `event` is done; with `wait`, answer once it is."""

    event: int
    wait: bool
    token: int


class EventDone(Command, tag=16, frozen=True):
    """Relay: event `event` (recorded on another node) is done, or will never be (`error`)."""

    socket = "hb"
    event: int
    error: str


class Profile(Command, tag=17, frozen=True):
    """Start (`on`) or stop recording a timeline of this session; stopping answers with it."""

    on: bool
    token: int


class Join(Command, tag=18, frozen=True):
    """The session's data channel: rendezvous store, key prefix, size, channel name.

    The master is the last rank (`world` - 1); node i is rank i. The worker joins off its
    socket thread, so a store it cannot reach never stalls its other masters.
    """

    store: str
    prefix: str
    world: int
    channel: str
    timeout: float  # seconds the worker tries to reach the store: the master's to choose
    token: int  # answered (Done, or Failed naming what it could not reach) once joined


class Stats(Command, tag=22, frozen=True):
    """Report live tensors and bytes of this session."""

    token: int


class PeerLost(Command, tag=29, frozen=True):
    """Node `rank` is gone (`reason`): fail every receive from it on the data channel now."""

    socket = "hb"
    rank: int
    reason: str


# -- commands run by a stream's executor ----------------------------------------------------

class Create(StreamCommand, tag=3, frozen=True):
    """Allocate tensor `out` on `device`: kind in empty/zeros/ones/full/arange/rand/randn."""

    out: int
    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: int
    args: tuple


class Put(StreamCommand, tag=4, frozen=True):
    """Tensor `out` from bytes in data frame `frame` (or channel tag when frame < 0)."""

    data_frame = True
    out: int
    shape: tuple[int, ...]
    dtype: str
    device: int
    frame: int


class Call(StreamCommand, tag=5, frozen=True):
    """Run registry op `op` on args (Refs resolved on the worker); results to ids `outs`."""

    quick = True

    outs: tuple[int, ...]
    op: str
    args: tuple
    kwargs: dict
    # NumPy's floating-point error state (np.geterr()) at issue, where not NumPy's default.
    fp: dict | None = None


class CallGet(Call, tag=40, frozen=True):
    """A Call, then a Get of its one result: answered (`token`) with the result's bytes, or
    with the error a Get after the Call would raise. A scalar read right after its op,
    `float(t.sum())`, is one command, where it was two."""

    sync_point = answered = True
    token: int = -1  # (a default: it follows Call's fp, which has one)


class Remote(StreamCommand, tag=6, frozen=True):
    """Run a cloudpickled user function; array results become tensors `outs`."""

    needs_key = True
    outs: tuple[int, ...]
    fn: bytes
    args: tuple
    kwargs: dict


class Free(StreamCommand, tag=7, frozen=True):
    """Drop tensors `ids` once `uses` streams (each sent this Free) have reached it."""

    always_runs = quick = True
    ids: tuple[int, ...]
    uses: int


class Get(StreamCommand, tag=8, frozen=True):
    """Send tensor `ref`'s bytes back once `stream` reaches this point."""

    sync_point = answered = always_runs = True
    ref: int
    token: int


class Meta(StreamCommand, tag=9, frozen=True):
    """Report tensor `ref`'s shape and dtype once `stream` reaches this point."""

    sync_point = answered = always_runs = True
    ref: int
    token: int


class Layout(StreamCommand, tag=43, frozen=True):
    """Report tensor `ref`'s strides and NumPy's flags once `stream` reaches this point."""

    sync_point = answered = always_runs = True
    ref: int
    token: int


class Share(StreamCommand, tag=38, frozen=True):
    """Copy tensor `ref` into a new /dev/shm segment once `stream` reaches this point, and
    name it, for a master on this host to map read-only (t.numpy(copy=False))."""

    sync_point = answered = always_runs = True
    ref: int
    token: int


class Lend(StreamCommand, tag=41, frozen=True):
    """Pin tensor `ref`'s bytes once `stream` reaches this point, and say where they are
    (pid, address, nbytes, netaddr.host_identity()), for a master on this host to copy them
    in place (mwrt.master.inplace); None for one not in NumPy's host memory in C order. Held
    until the master's Unlend."""

    sync_point = answered = always_runs = True
    ref: int
    token: int


class Unlend(StreamCommand, tag=42, frozen=True):
    """Drop the pin of Lend `lend` (on the same stream, so it never comes first): the master
    has read it, or gave up."""

    always_runs = True
    lend: int


class Sync(StreamCommand, tag=10, frozen=True):
    """Answer once `stream` reaches this point (raising its sticky error, if any)."""

    sync_point = answered = always_runs = True
    token: int


class Record(StreamCommand, tag=13, frozen=True):
    """Mark event `event` done when `stream` reaches this point (timing if asked)."""

    always_runs = True
    event: int
    timing: bool


class WaitEvent(StreamCommand, tag=14, frozen=True):
    """Hold `stream` until event `event` is done (the master relays events of other nodes)."""

    event: int


class SendTo(StreamCommand, tag=19, frozen=True):
    """Send tensor `ref` to channel rank `peer` with `tag`; token >= 0: say Done first."""

    answered = always_runs = True
    ref: int
    peer: int
    tag: int
    token: int


class RecvFrom(StreamCommand, tag=20, frozen=True):
    """Receive tensor `out` (shape, dtype, device) from channel rank `peer` with `tag`.

    The receive is posted when the command arrives; token >= 0: say Done once posted, so
    the sender's bytes land in place instead of a stash.
    """

    posts_receive = True
    out: int
    shape: tuple[int, ...]
    dtype: str
    device: int
    peer: int
    tag: int
    token: int


class Collective(StreamCommand, tag=21, frozen=True):
    """Run collective `kind` over the nodes `ranks` (group `group`) on tensor `ref`.

    `args` holds the collective's options (op, root); `out`, when not -1, names a new
    tensor of `out_shape` for collectives that make one (all_gather, gather, scatter).
    """

    always_runs = True
    kind: str
    group: int
    ranks: tuple[int, ...]
    ref: int
    args: dict
    out: int
    out_shape: tuple[int, ...]


class Expect(StreamCommand, tag=30, frozen=True):
    """Manual stream order: fail naming stream `made_on` unless tensor `ref` exists by now."""

    ref: int
    made_on: int


class DefineGraph(Command, tag=31, frozen=True):
    """Keep graph `graph`: the stream commands packed in `body`, replayed as one; `inputs`
    are the tensor ids a Replay may rebind."""

    graph: int
    body: bytes
    inputs: tuple[int, ...]


class Replay(Command, tag=32, frozen=True):
    """Run graph `graph` on its recorded streams; `bindings` pairs captured and new ids."""

    graph: int
    bindings: tuple[int, ...]


class DropGraph(Command, tag=33, frozen=True):
    """Forget graph `graph`."""

    graph: int


class SaveTensors(StreamCommand, tag=34, frozen=True):
    """Write tensors `refs` as `names` to safetensors file `file` of checkpoint folder `folder`
    on this worker's disk (none when `names` is empty); their CRC32s become tensor `out`; then
    remove files `stale` of the folder (an older checkpoint's), and every file a save wrote
    of a generation older than `older` (a killed save's, which no manifest lists). Every
    path is relative, and inside `folder`."""

    needs_key = True  # it writes files as the worker's user: what shipped code could do
    out: int
    folder: str
    file: str
    names: tuple[str, ...]
    refs: tuple[int, ...]
    stale: tuple[str, ...]
    older: int = 0


class LoadTensors(StreamCommand, tag=35, frozen=True):
    """Read tensors `names` from safetensors file `file` (relative, inside checkpoint folder
    `folder`) into ids `outs`, each checked against its manifest entry in `expected`
    ([dtype, shape, crc32] per name)."""

    needs_key = True
    outs: tuple[int, ...]
    folder: str
    file: str
    names: tuple[str, ...]
    expected: tuple[tuple[str, tuple[int, ...], int | None], ...]


class Cancel(Command, tag=37, frozen=True):
    """Drop what is queued on this session's streams behind the commands running now (which
    run to their end); answered once they are marked."""

    token: int


class Name(Command, tag=36, frozen=True):
    """Call tensor `ref` `name` in this session: a master that re-attaches finds it so."""

    ref: int
    name: str


# -- replies: worker -> master --------------------------------------------------------------

class Welcome(Reply, tag=23, frozen=True):
    """Answer to Hello: who the worker is."""

    incarnation: str
    hostname: str
    pid: int
    devices: int
    data_address: str
    gpus: tuple = ()  # a dict per GPU (arrays.devices()): index, name, memory, capability
    # A named session re-attached: its named tensors, last command id and streams ({}: new).
    resumed: dict = msgspec.field(default_factory=dict)
    streams: int = 0  # streams one master may use there (MWRT_SESSION_STREAMS); 0: not said


class Pong(Reply, tag=24, frozen=True):
    """Answer to Ping."""

    incarnation: str


class Done(Reply, tag=25, frozen=True):
    """A sync point was reached; `value` is the answer (None, bool, dict)."""

    value: object


class Data(Reply, tag=26, frozen=True):
    """A tensor's bytes: in data frame 0."""

    shape: tuple[int, ...]
    dtype: str


class Failed(Reply, tag=27, frozen=True):
    """An error: `info` holds kind, message, node, device, stream, op, shapes, traceback."""

    info: dict


class Warned(Reply, tag=39, frozen=True):
    """Warnings NumPy gave on a stream's ops since its last answer, sent before that answer:
    (command id, text) pairs; token is -2 (it answers no one)."""

    warnings: tuple


class Fired(Reply, tag=28, frozen=True):
    """Event `event` (one another node waits on) is done; the master relays it."""

    event: int
    time: float


# -- the table ------------------------------------------------------------------------------

def _concrete(cls) -> list:
    found = [cls] if cls.__struct_config__.tag is not None else []
    return found + [c for sub in cls.__subclasses__() for c in _concrete(sub)]


def code(cls) -> int:
    """The wire code of message class `cls`."""
    return cls.__struct_config__.tag


# Message classes by wire code: a code, once given, keeps its meaning; new messages take new
# codes (and old masters meet the version check in the header, not a misread message).
MESSAGES = sorted(_concrete(Message), key=code)
if [code(cls) for cls in MESSAGES] != list(range(len(MESSAGES))):
    raise RuntimeError(f"messages: wire codes must be 0..{len(MESSAGES) - 1}, each once (got "
                       f"{sorted(code(cls) for cls in MESSAGES)})")
for _cls in MESSAGES:
    _cls.handler = re.sub(r"(?<!^)(?=[A-Z])", "_", _cls.__name__).lower()
