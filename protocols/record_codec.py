"""Flower records as JSON, exactly: what a silo's job file and the server's checkpoint keep of `context.state`.

A silo with a `state-dir` writes its state records to a JSON file per job (`client.privacy_state`), and the server's
checkpoint holds the state records of the silos it simulates in-process (`server.checkpoint`); both read them back
with :func:`decode_record`. The encoding is exact: array payloads and byte values travel as base64, every other value
as JSON has it, so a record read back equals the record written, byte for byte. Its layout is part of those files'
format: a state written before must load after.
"""

from __future__ import annotations

import base64

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord


def encode_value(value: object) -> object:
    """A config or metric value as JSON-able data: bytes as ``{"b64": ...}``, lists item by item."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    return value


def _decode_value(value: object) -> object:
    """The value :func:`encode_value` encoded."""
    if isinstance(value, dict):
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    return value


def encode_record(record: ConfigRecord | MetricRecord | ArrayRecord) -> dict[str, object]:
    """A Flower record as JSON-able data, exactly (array bytes in base64); :func:`decode_record` reads it back."""
    if isinstance(record, ArrayRecord):
        return {
            "type": "array",
            "arrays": {
                key: {
                    "dtype": a.dtype,
                    "shape": list(a.shape),
                    "stype": a.stype,
                    "data": base64.b64encode(a.data).decode(),
                }
                for key, a in record.items()
            },
        }
    kind = "metric" if isinstance(record, MetricRecord) else "config"
    return {"type": kind, "values": {k: encode_value(v) for k, v in record.items()}}


def decode_record(data: dict) -> ConfigRecord | MetricRecord | ArrayRecord:
    """The record :func:`encode_record` encoded."""
    if data["type"] == "array":
        return ArrayRecord(
            {
                key: Array(a["dtype"], tuple(a["shape"]), a["stype"], base64.b64decode(a["data"]))
                for key, a in data["arrays"].items()
            }
        )
    values = {k: _decode_value(v) for k, v in data["values"].items()}
    if data["type"] == "metric":
        return MetricRecord(values)
    if data["type"] == "config":
        return ConfigRecord(values)
    raise ValueError(f"unknown record type {data['type']!r}")
