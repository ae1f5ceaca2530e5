"""The hand-written codec of ``policy.proto``: the same field table as the ``.proto`` file, bytes that the protobuf
library reads and writes identically (messages built from the ``.proto`` itself), and malformed bytes refused with a
``WireError`` sentence, never another exception."""

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrl_rl.deploy import wire

PROTO = Path(wire.__file__).with_name("policy.proto")


def parse_proto() -> dict[str, tuple]:
    """Message name -> ((number, name, type), ...) as declared in policy.proto (comments dropped)."""
    text = re.sub(r"//[^\n]*", "", PROTO.read_text())
    out = {}
    for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
        out[name] = tuple((int(n), f, f"repeated {t}" if rep else t)
                          for rep, t, f, n in re.findall(r"(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body))
    return out


def test_the_codec_declares_the_fields_of_the_proto_file():
    assert parse_proto() == wire.SCHEMA
    text = PROTO.read_text()
    assert "package ctrl_rl.policy.v1;" in text
    assert "rpc Info(InfoRequest) returns (InfoResponse);" in text
    assert "rpc Act(ActRequest) returns (ActResponse);" in text


def protobuf_classes():
    """Message classes of the protobuf library, built from the parsed .proto (no protoc needed)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # protobuf comes with tensorboard

    F = descriptor_pb2.FieldDescriptorProto
    types = {"string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
             "double": F.TYPE_DOUBLE}
    fd = descriptor_pb2.FileDescriptorProto(name="policy.proto", package="ctrl_rl.policy.v1", syntax="proto3")
    for name, table in parse_proto().items():
        m = fd.message_type.add(name=name)
        for number, fname, kind in table:
            rep, base = kind.startswith("repeated "), kind.removeprefix("repeated ")
            f = m.field.add(name=fname, number=number, label=F.LABEL_REPEATED if rep else F.LABEL_OPTIONAL)
            if base in types:
                f.type = types[base]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".ctrl_rl.policy.v1.{base}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ctrl_rl.policy.v1.{n}"))
            for n in wire.MESSAGES}


names = st.text(max_size=12)
tensors = st.builds(wire.Tensor, names, st.sampled_from(wire.DTYPES),
                    st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=4), st.binary(max_size=40))


@settings(max_examples=60, deadline=None)
@given(inputs=st.lists(tensors, max_size=3), request_id=st.integers(0, 2 ** 64 - 1),
       server_ms=st.floats(allow_nan=False), text=st.text(max_size=30), max_batch=st.integers(-(2 ** 63), 2 ** 63 - 1))
def test_bytes_agree_with_the_protobuf_library_both_ways(inputs, request_id, server_ms, text, max_batch):
    pb = protobuf_classes()
    for msg in (wire.ActRequest(inputs, request_id), wire.ActResponse(inputs, request_id, server_ms),
                wire.InfoResponse(text, text[::-1], max_batch), wire.InfoRequest()):
        cls = type(msg).__name__
        theirs = pb[cls]()
        theirs.ParseFromString(wire.encode(msg))  # ours -> protobuf
        assert wire.decode(type(msg), theirs.SerializeToString()) == msg  # protobuf -> ours
        assert wire.encode(msg) == theirs.SerializeToString(deterministic=True)


def test_arrays_round_trip_in_every_dtype():
    for dtype in wire.DTYPES:
        a = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
        msg = wire.decode(wire.ActRequest, wire.encode(wire.ActRequest([wire.to_tensor("x", a)], 7)))
        b = wire.to_array(msg.inputs[0])
        assert b.dtype == a.dtype and np.array_equal(a, b) and msg.request_id == 7
    with pytest.raises(wire.WireError, match="dtype"):
        wire.to_tensor("x", np.zeros(2, np.complex64))


@pytest.mark.parametrize("tensor,needle", [
    (wire.Tensor("x", "float32", [2, 3], b"\0" * 20), "has 20 bytes of data: expected 24"),
    (wire.Tensor("x", "float16", [1], b"\0\0"), "dtype 'float16'"),
    (wire.Tensor("x", "float32", [-1, 2], b""), "dimensions >= 0"),
    (wire.Tensor("x", "uint8", [2 ** 40, 2 ** 40], b""), "bytes of data"),
])
def test_a_tensor_that_does_not_match_its_shape_or_dtype_is_refused(tensor, needle):
    with pytest.raises(wire.WireError, match=re.escape(needle)):
        wire.to_array(tensor)


@pytest.mark.parametrize("data,needle", [
    (b"\x0a\x05ab", "claims 5 bytes"),                      # inputs: length past the end
    (b"\x10\xff\xff", "ends inside the varint"),            # request_id: truncated varint
    (b"\x10" + b"\xff" * 11, "longer than ten bytes"),
    (b"\x08\x01", "wire type 0: expected 2"),               # inputs as a varint
    (b"\x0b", "wire type 3"),                                # a group
    (b"\x00\x01", "numbered 0"),
    (b"\x0a\x03\x0a\x01\xff", "not valid UTF-8"),           # Tensor.name
    (b"\x7a\x05ab", "runs past the end"),                    # unknown field 15, too long
])
def test_malformed_bytes_give_a_wire_error_sentence(data, needle):
    with pytest.raises(wire.WireError, match=re.escape(needle)):
        wire.decode(wire.ActRequest, data)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes_decode_or_raise_a_wire_error_only(data):
    try:
        wire.decode(wire.ActRequest, data)
    except wire.WireError:
        pass


def test_unknown_fields_are_skipped_and_unpacked_shapes_accepted():
    unknown = b"\x78\x05" + b"\x85\x01\x05\x00\x00\x00" + b"\x7a\x02hi"  # fields 15 (varint), 16 (I32), 15 (len)
    shape = b"\x18\x02\x18\x03"  # Tensor.shape as two unpacked varints
    t = wire.decode(wire.Tensor, unknown + shape + b"\x12\x05uint8" + b"\x22\x06" + bytes(6))
    assert t.shape == [2, 3] and t.dtype == "uint8" and wire.to_array(t).shape == (2, 3)
