"""The protobuf messages the Tinker client sends and reads, in a small codec of our own (no protobuf package).

The client posts ``/api/v1/forward_backward`` as a protobuf ``ForwardBackwardRequest`` and asks for
``ForwardBackwardOutput`` and ``SampleResponse`` results as protobuf (``Accept: application/x-protobuf``);
every other message is JSON. This module decodes the one request into the JSON shape of the same
request (so both bodies are validated by the same pydantic models, with the same field paths) and
encodes the two responses. Field numbers follow the client's ``tinker_public.proto`` (tinker 0.38):

    ForwardBackwardRequest  1 model_id  2 seq_id  3 data (Datum)  4 loss_fn  5 loss_fn_config (map<str,double>)
                            6 forward_only  7 loss_fn_config_v2 (map<str, {1 number | 2 text}>)
    Datum                   1 model_input (Chunk)  2 loss_fn_inputs (map<str, Tensor>)
    Chunk                   1 encoded_text {1 tokens: int32 bytes}  2 image  3 dmel
    Tensor                  1 dense bytes  2 sparse_csr  3 dtype (1 float32, 2 int64, 3 int32)  4 shape (packed)
    ForwardBackwardOutput   1 loss_fn_output_type  2 loss_fn_outputs (ArrayRecord)  3 metrics (map<str,double>)
    ArrayRecord             1 type_tag  2 fields (map<str, BatchedTensor>)  3 num_datums
    BatchedTensor           1 data  2 offsets (int64 byte offsets, n + 1)  3 dtype  4 trailing_shape (packed)
    SampleResponse          1 sequences {1 stop_reason  2 tokens int32  3 logprobs float32}  2 prompt_logprobs
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from reinforge.service.schema import FieldError

DTYPES = {1: ("float32", np.float32), 2: ("int64", np.int64), 3: ("int64", np.int32)}
FLOAT32, INT64 = 1, 2
STOP_REASONS = {"stop": 0, "length": 1}


class WireError(FieldError):
    """A protobuf body that does not parse (422); ``field`` names where."""


# ---------------------------------------------------------------------------------------------- decoding
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("body", "truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("body", "varint over 10 bytes")


def fields(buf: bytes, where: str = "body") -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of every field of one message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _varint(buf, pos)
        elif kind == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(where, "truncated length-delimited field")
            value, pos = buf[pos:pos + size], pos + size
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            value, pos = buf[pos:pos + width], pos + width
        else:
            raise WireError(where, f"unsupported wire type {kind}")
        yield number, kind, value


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed(values: list[tuple[int, Any]]) -> list[int]:
    out: list[int] = []
    for kind, v in values:
        if kind == 0:
            out.append(_signed(v))
            continue
        pos = 0
        while pos < len(v):
            x, pos = _varint(v, pos)
            out.append(_signed(x))
    return out


def _map(buf: bytes, where: str) -> tuple[str, Any]:
    key, value = "", b""
    for number, _, v in fields(buf, where):
        if number == 1:
            key = v.decode()
        elif number == 2:
            value = v
    return key, value


def _tensor(buf: bytes, where: str) -> dict[str, Any]:
    dense, dtype, shape, sparse = b"", 0, [], False
    shapes: list[tuple[int, Any]] = []
    for number, kind, v in fields(buf, where):
        if number == 1:
            dense = v
        elif number == 2:
            sparse = True
        elif number == 3:
            dtype = v
        elif number == 4:
            shapes.append((kind, v))
    if sparse:
        raise WireError(where, "sparse tensors are not supported; send it dense")
    if dtype not in DTYPES:
        raise WireError(f"{where}.dtype", f"unsupported dtype {dtype} (float32 or int64)")
    name, np_dtype = DTYPES[dtype]
    shape = _packed(shapes)
    if len(dense) % np.dtype(np_dtype).itemsize:
        raise WireError(where, "byte length is not a whole number of elements")
    data = np.frombuffer(dense, dtype=np_dtype).tolist()
    return {"data": data, "dtype": name, "shape": shape or None}


def _chunk(buf: bytes, where: str) -> dict[str, Any]:
    for number, _, v in fields(buf, where):
        if number == 1:
            tokens = b"".join(t for n, _, t in fields(v, where) if n == 1)
            return {"type": "encoded_text", "tokens": np.frombuffer(tokens, dtype=np.int32).tolist()}
        raise WireError(where, "only encoded_text chunks are supported (no images or audio)")
    return {"type": "encoded_text", "tokens": []}


def _datum(buf: bytes, where: str) -> dict[str, Any]:
    chunks, inputs = [], {}
    for number, _, v in fields(buf, where):
        if number == 1:
            chunks.append(_chunk(v, f"{where}.model_input.chunks.{len(chunks)}"))
        elif number == 2:
            key, value = _map(v, where)
            inputs[key] = _tensor(value, f"{where}.loss_fn_inputs.{key}")
    return {"model_input": {"chunks": chunks}, "loss_fn_inputs": inputs}


def _config_value(buf: bytes) -> float | str:
    for number, _, v in fields(buf, "loss_fn_config"):
        return struct.unpack("<d", v)[0] if number == 1 else v.decode()
    return 0.0


def decode_forward_backward(body: bytes) -> dict[str, Any]:
    """A protobuf ``ForwardBackwardRequest`` as the JSON request it stands for (plus ``forward_only``)."""
    data: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    config_v2: dict[str, Any] = {}
    out: dict[str, Any] = {"model_id": "", "seq_id": None, "forward_only": False}
    loss_fn = ""
    for number, _, v in fields(body):
        if number == 1:
            out["model_id"] = v.decode()
        elif number == 2:
            out["seq_id"] = _signed(v)
        elif number == 3:
            data.append(_datum(v, f"forward_backward_input.data.{len(data)}"))
        elif number == 4:
            loss_fn = v.decode()
        elif number == 5:
            key, value = _map(v, "loss_fn_config")
            config[key] = struct.unpack("<d", value)[0]
        elif number == 6:
            out["forward_only"] = bool(v)
        elif number == 7:
            key, value = _map(v, "loss_fn_config")
            config_v2[key] = _config_value(value)
    merged = {**config, **config_v2}  # the client writes both; v2 (numbers and text) wins
    out["forward_backward_input"] = {"data": data, "loss_fn": loss_fn, "loss_fn_config": merged or None}
    return out


# ---------------------------------------------------------------------------------------------- encoding
def _enc_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _enc_varint(number << 3 | 2) + _enc_varint(len(payload)) + payload


def _field_varint(number: int, value: int) -> bytes:
    return _enc_varint(number << 3) + _enc_varint(value) if value else b""


def _field_double(number: int, value: float) -> bytes:
    return _enc_varint(number << 3 | 1) + struct.pack("<d", value)


def _packed_ints(number: int, values: list[int]) -> bytes:
    return _field_bytes(number, b"".join(_enc_varint(v) for v in values)) if values else b""


def _batched(arrays: list[np.ndarray], dtype: int) -> bytes:
    """One field of every datum: flat arrays back to back, byte offsets n + 1 (1-D per datum)."""
    np_dtype = DTYPES[dtype][1]
    flat = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.cumsum([0] + [a.nbytes for a in flat]).astype(np.int64)
    data = b"".join(a.tobytes() for a in flat)
    return _field_bytes(1, data) + _field_bytes(2, offsets.tobytes()) + _field_varint(3, dtype)


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: per-datum float32 arrays (the same keys for every datum) and the metrics."""
    record = _field_bytes(1, b"ArrayRecord") + _field_varint(3, len(outputs))
    for name in (outputs[0] if outputs else {}):
        entry = _field_bytes(1, name.encode()) + _field_bytes(2, _batched([o[name] for o in outputs], FLOAT32))
        record += _field_bytes(2, entry)
    body = _field_bytes(1, b"ArrayRecord") + _field_bytes(2, record)
    for key, value in metrics.items():
        body += _field_bytes(3, _field_bytes(1, key.encode()) + _field_double(2, float(value)))
    return body


def encode_sample_response(sequences: list[dict[str, Any]], prompt_logprobs: list[float] | None) -> bytes:
    """A ``SampleResponse``: each sequence's stop reason, tokens (int32) and log-probs (float32); the
    prompt's log-probs (float32, NaN where none: the first position) when asked for."""
    body = b""
    for seq in sequences:
        msg = (_field_varint(1, STOP_REASONS[seq["stop_reason"]])
               + _field_bytes(2, np.asarray(seq["tokens"], dtype=np.int32).tobytes())
               + _field_bytes(3, np.asarray(seq["logprobs"], dtype=np.float32).tobytes()))
        body += _field_bytes(1, msg)
    if prompt_logprobs is not None:
        body += _field_bytes(2, np.asarray(prompt_logprobs, dtype=np.float32).tobytes())
    return body
