"""Cluster config files: YAML in the shape of the `ClusterConfig` message, made pleasant to write.

- Enum values may be written short and lowercase: `window_kind: sliding` for WINDOW_KIND_SLIDING.
- Fields in seconds (`*_s`) take numbers or durations: `window_s: 7d`, `half_life_s: 36h`.
Anything else is exactly the proto's field names, so the file and the API never drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gpufair.v1 import cluster_pb2

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigFileError(ValueError):
    """A config file that cannot be read; the message names the file and the field."""


def parse_duration_s(value: Any, path: str) -> Any:
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise ConfigFileError(f"{path}: {value!r} is not a duration (e.g. 90s, 30m, 36h, 7d)")
        return float(match.group(1)) * _UNIT_S[match.group(2)]
    return value


def _enum_name(field: FieldDescriptor, value: Any, path: str) -> Any:
    if not isinstance(value, str):
        return value
    enum_type = field.enum_type
    assert enum_type is not None
    names = [v.name for v in enum_type.values]
    if value in names:
        return value
    prefix = names[0].removesuffix("UNSPECIFIED")
    full = prefix + value.upper().replace("-", "_")
    if full in names:
        return full
    choices = ", ".join(n.removeprefix(prefix).lower() for n in names[1:])
    raise ConfigFileError(f"{path}: unknown value {value!r}; choose one of {choices}")


def _normalise(data: Any, descriptor: Descriptor, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"{path or 'the file'}: expected a mapping, got {type(data).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name.get(str(key))
        here = f"{path}.{key}" if path else str(key)
        if field is None:
            known = ", ".join(sorted(descriptor.fields_by_name))
            raise ConfigFileError(f"{here}: unknown field; {descriptor.name} has {known}")
        out[str(key)] = _normalise_value(field, value, here)
    return out


def _normalise_value(field: FieldDescriptor, value: Any, path: str) -> Any:
    is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
    if field.is_repeated and not is_map:
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigFileError(f"{path}: expected a list")
        return [_normalise_scalar(field, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if is_map:
        if not isinstance(value, dict):
            raise ConfigFileError(f"{path}: expected a mapping")
        return {str(k): v for k, v in value.items()}
    return _normalise_scalar(field, value, path)


def _normalise_scalar(field: FieldDescriptor, value: Any, path: str) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        return _normalise(value, field.message_type, path)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum_name(field, value, path)
    if field.name.endswith("_s"):
        return parse_duration_s(value, path)
    return value


def parse_config(data: Any, source: str = "config") -> cluster_pb2.ClusterConfig:
    """A ClusterConfig from already-parsed YAML data."""
    normalised = _normalise(data or {}, cluster_pb2.ClusterConfig.DESCRIPTOR, "")
    msg = cluster_pb2.ClusterConfig()
    try:
        json_format.ParseDict(normalised, msg)
    except json_format.ParseError as exc:
        raise ConfigFileError(f"{source}: {exc}") from None
    return msg


def load_config_file(path: Path) -> cluster_pb2.ClusterConfig:
    """The file's ClusterConfig; any file that cannot be one (unreadable, not UTF-8, not YAML,
    nested too deeply, fields of the wrong shape) is one ConfigFileError naming the file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigFileError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}, "
            f"line {line}); save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigFileError(f"{path}: not valid YAML: nested too deeply") from None
    try:
        return parse_config(data, str(path))
    except ConfigFileError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    except RecursionError:
        raise ConfigFileError(f"{path}: nested too deeply for a cluster config") from None


def message_to_yaml(msg: Message) -> str:
    data = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return yaml.safe_dump(data, sort_keys=False)
