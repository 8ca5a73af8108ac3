"""One schema for every message (issue 14): each message class round-trips through the codec
with its traits, the traits agree with the fields and with the worker's handlers, a command
that does not belong on its socket is refused by name, and no module outside mwrt/protocol
knows a wire code or builds a message as a bare tuple."""

from __future__ import annotations

import ast
import os

import msgspec
import numpy as np
import pytest
from tests.support.daemons import stop_worker
from tests.faults.test_faults_wire import RawMaster

import mwrt
from mwrt.errors import WireError
from mwrt.protocol import wire
from mwrt.worker import routes

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.abspath(mwrt.__file__))
_SAMPLES = {int: -7, str: "s", tuple: (1, (2, "x")), dict: {"k": (1,), "n": None}, bool: True,
            bytes: b"\x00\xff", float: 2.5, object: {"shape": (2, 3), "dtype": "<f4"},
            tuple[int, ...]: (3, -1), tuple[str, ...]: ("a", "b"), dict | None: {"over": "raise"},
            tuple[tuple[str, tuple[int, ...], int | None], ...]: (("<f4", (2, 3), 7),
                                                                   ("<i8", (), None))}
COMMANDS = [cls for cls in wire.MESSAGES if cls.socket]
REPLIES = [cls for cls in wire.MESSAGES if not cls.socket]


def _sample(cls):
    """A message of `cls` with a value of each field's type."""
    return cls(*(_SAMPLES[f.type] for f in msgspec.structs.fields(cls)))


@pytest.mark.parametrize("cls", wire.MESSAGES, ids=lambda cls: cls.__name__)
def test_every_message_round_trips_with_its_traits(cls):
    message = _sample(cls)
    body = wire.encode_body([message])
    (back,) = wire.decode_body(body)
    assert type(back) is cls and back == message
    assert wire.traits(type(back)) == wire.traits(cls)
    (row,) = msgspec.msgpack.decode(body)  # the wire row: [code, *fields], as before the schema
    assert row[0] == wire.code(cls) and len(row) == 1 + len(cls.__struct_fields__)



@pytest.mark.parametrize("data", [(), (b"\x01\x02",), (b"", b"abc", np.arange(3, dtype=np.uint8))])
def test_a_message_is_one_frame_holding_its_body_and_small_arrays(data):
    body = wire.encode_body([wire.Get(5, -1, 7, 9)])
    frames = wire.encode(41, [wire.Get(5, -1, 7, 9)], data)
    assert len(frames) == 1  # where version 1 sent a header, a body and a frame per array
    seq, messages, got = wire.decode(frames + [b"big"])  # a large array rides on its own
    assert (seq, messages) == (41, [wire.Get(5, -1, 7, 9)])
    assert [bytes(frame) for frame in got] == [bytes(memoryview(d)) for d in data] + [b"big"]
    assert bytes(wire.open_envelope(frames)[1]) == body


@pytest.mark.parametrize("first, error", [
    (msgspec.msgpack.encode([b"mwrt", 1, 3]), r"version mismatch \(got 1, expected 2\)"),
    (b"mwrt\x07" + bytes(13), r"version mismatch \(got 7, expected 2\)"),
    (b"xyz", "not an mwrt message"),
    (wire.envelope(1, b"\x90")[:-1], "does not add up"),
    (wire.envelope(1, b"\x90", [b"ab"]) + b"!", "does not add up"),
    (wire.envelope(1, b"\x90" * 64), "too large"),
])
def test_a_malformed_envelope_is_named(first, error):
    with pytest.raises(WireError, match=error):
        wire.open_envelope([first], max_bytes=32)


NESTED = (wire.Ref(3), (slice(0, 4, None), 2, (Ellipsis, None)), [[1, 2], {"a": [3, (4,)]}],
          {"k": [5, [6]]}, np.float32(0.5), np.arange(3))


@pytest.mark.parametrize("decode", [wire.decode_body, lambda body: list(wire.iter_body(body))])
def test_arrays_arrive_as_tuples_at_every_depth(decode):
    """msgspec decodes arrays as lists where a field's type does not say tuple; the wire
    gives tuples everywhere, as a list index must not become a fancy one on the worker."""
    sent = [wire.Call(1, -1, (7,), "getitem", NESTED, {"axis": [0, [1]], "keep": True}),
            wire.Call(2, -1, (8,), "add", (wire.Ref(1), wire.Ref(2)), {}),
            wire.Done(3, {"shape": [2, 3], "dtype": "<f4"}), wire.Failed(4, {"shapes": [[1]]})]
    got = decode(wire.encode_body(sent))
    first = got[0]
    assert first.args[1] == (slice(0, 4, None), 2, (Ellipsis, None))
    assert first.args[2] == ((1, 2), {"a": (3, (4,))}) and first.args[3] == {"k": (5, (6,))}
    assert type(first.args[4]) is np.float32 and first.args[5].tolist() == [0, 1, 2]
    assert first.kwargs == {"axis": (0, (1,)), "keep": True}
    assert got[1] == sent[1] and got[2].value["shape"] == (2, 3)
    assert got[3].info == {"shapes": ((1,),)}


def test_a_message_outside_the_fast_schema_decodes_as_before():
    """Fields the schema types narrowly (outs: tuple[int, ...]) still take what the field
    check takes (any tuple; a bool is an int), read by the field-by-field path."""
    body = msgspec.msgpack.encode([[wire.code(wire.Call), True, -1, (True, "x"), "add", (), {},
                                    None]])
    for got in (wire.decode_body(body), list(wire.iter_body(body))):
        assert got == [wire.Call(True, -1, (True, "x"), "add", (), {})]


@pytest.mark.parametrize("row, error", [
    ([wire.code(wire.Sync), 1, -1, 2, 99], "Sync takes 3 fields"),
    ([wire.code(wire.Sync), 1, -1], "Sync takes 3 fields"),
    ([wire.code(wire.Sync), 1, "s", 2], "Sync.stream has the wrong type"),
    ([wire.code(wire.Sync), 1, True, 2], "Sync.stream has the wrong type"),  # no stream id
    ([99, 1], "unknown message code 99"),
    ("x", "a message must be"),
])
def test_malformed_rows_are_named(row, error):
    body = msgspec.msgpack.encode([row])
    for decode in (wire.decode_body, lambda body: list(wire.iter_body(body))):
        with pytest.raises(WireError, match=error):
            decode(body)

def test_codes_are_dense_and_every_class_is_frozen():
    assert [wire.code(cls) for cls in wire.MESSAGES] == list(range(len(wire.MESSAGES)))
    message = _sample(wire.Sync)
    with pytest.raises(AttributeError):
        message.token = 1


def test_traits_agree_with_the_fields():
    for cls in COMMANDS:
        fields = cls.__struct_fields__
        assert fields[0] == "id", cls
        assert cls.socket in ("tx", "rx", "hb"), cls
        if cls.on_stream:
            assert fields[1] == "stream" and cls.socket == "tx", cls
        if cls.sync_point:  # answered always; a CallGet's op is skipped as any op's, not
            # its answer (executor.skip: test_faults' CallGet cases)
            assert cls.on_stream and cls.answered and (cls.always_runs or cls is wire.CallGet)
        if cls.answered or cls.posts_receive:
            assert "token" in fields, cls
        if cls.data_frame:
            assert "frame" in fields, cls
    for cls in REPLIES:
        assert cls.__struct_fields__[0] == "token", cls
        assert not any(getattr(cls, t) for t in wire.TRAITS if t not in ("socket", "handler"))


def test_every_command_has_a_handler_named_like_it():
    stream = {cls for cls in COMMANDS if cls.on_stream}
    assert set(routes.STREAM) == stream
    for cls, handler in routes.STREAM.items():
        assert handler.__name__ == cls.handler, cls
    session = {cls for cls in COMMANDS if not cls.on_stream} - set(routes.BEFORE_SESSION)
    assert set(routes.SESSION) == session
    for cls, handler in routes.SESSION.items():
        assert handler.__name__ == cls.handler, cls


def test_a_command_on_the_wrong_socket_is_refused_naming_it():
    mwrt.shutdown()
    from tests.support.daemons import start_worker

    process, address = start_worker()
    master = RawMaster(address, "protocol")
    try:
        for seq, stray in enumerate([_sample(wire.Welcome), wire.PeerLost(id=1, rank=0,
                                                                           reason="x"),
                                     wire.Ping(id=1)], start=1):
            master.batch(seq, [wire.Sync(id=seq, stream=-1, token=100 + seq), stray])
            reply = master.recv()
            assert isinstance(reply, wire.Failed) and reply.token == -1, reply
            assert f"unknown command {type(stray).__name__} on SESSION/tx" in reply.info[
                "message"]
            assert master.recv(timeout=0.3) is None  # the Sync before it did not run either
        master.batch(10, [wire.Sync(id=10, stream=-1, token=7)])
        assert master.recv() == wire.Done(token=7, value=None)  # the session serves on
    finally:
        master.close()
        stop_worker(process)


# -- nothing outside mwrt/protocol knows a code or builds a bare tuple ----------------------

# Calls that take a message: the attribute called, and which argument is the message.
_TAKES_MESSAGE = {"issue": 0, "request": 0, "reply": 0, "send": 1, "append": 0}
_NOT_MESSAGES = (ast.Tuple, ast.List, ast.BinOp)


def _dotted(node) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def wire_violations(source: str, where: str) -> list[str]:
    """Places in `source` that use a wire code or pass a bare tuple where a message goes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("code", "CODES", "encode_raw",
                                                             "STREAM_CODES"):
            if _dotted(node.value).split(".")[-1] in ("wire", "messages"):
                found.append(f"{where}:{node.lineno}: {_dotted(node)}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, target = node.func.attr, _dotted(node.func.value)
        index = _TAKES_MESSAGE.get(name)
        if name == "append" and not target.endswith("batch"):
            continue  # only a node's batch holds messages
        if name == "send" and not target.endswith("wire"):
            index = 1 if target.endswith("daemon") or target == "self" else None
        if index is not None and len(node.args) > index and isinstance(node.args[index],
                                                                       _NOT_MESSAGES):
            found.append(f"{where}:{node.lineno}: {target}.{name}() given a bare "
                         f"{type(node.args[index]).__name__.lower()}, not a message")
    return found


def test_the_checker_sees_codes_and_bare_tuples():
    bad = ("node.issue((_CALL, next(node.ids), 0))\nx = wire.code(wire.Call)\n"
           "self.batch.append((7, 1))\nnode.request((1, 2) + (3,), 'what')\n"
           "self.send(identity, (1, 2))\n")
    assert len(wire_violations(bad, "example")) == 5
    good = ("node.issue(wire.Call(id=1, stream=0, outs=(), op='x', args=(1,), kwargs={}))\n"
            "self.send(identity, wire.Done(token=1, value=(1, 2)))\n")
    assert wire_violations(good, "example") == []


def test_no_module_outside_protocol_knows_a_wire_code_or_builds_a_bare_tuple():
    found = []
    for folder, _, files in os.walk(ROOT):
        if os.path.relpath(folder, ROOT).split(os.sep)[0] == "protocol":
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    found += wire_violations(f.read(), os.path.relpath(path, ROOT))
    assert not found, "build messages as wire.Name(field=...), never tuples or codes:\n" + \
        "\n".join(found)
