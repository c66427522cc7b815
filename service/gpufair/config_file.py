"""Cluster config files: YAML in the shape of the `ClusterConfig` message, made pleasant to write.

- Enum values may be written short and lowercase: `window_kind: sliding` for WINDOW_KIND_SLIDING.
- Fields in seconds (`*_s`) take numbers or durations: `window_s: 7d`, `half_life_s: 36h`,
  `1h30m`, `500ms` (units ms, s, m, h, d, w; several may follow each other, largest first).
Anything else is exactly the proto's field names, so the file and the API never drift apart.

`message_to_yaml` writes the same short forms back (enums short, `*_s` fields as durations,
64-bit integers as numbers), so `gpufair get config -o yaml` gives a file `apply` takes back, defaults left out as a person leaves them out.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gpufair.v1 import cluster_pb2

_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)"
_DURATION_RE = re.compile(rf"^\s*(?:{_PART}\s*)+$")
_PART_RE = re.compile(_PART)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Units written back, largest first; weeks are left out: `14d` reads more plainly than `2w`.
_OUTPUT_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


class ConfigFileError(ValueError):
    """A config file that cannot be read; the message names the file and the field."""


def duration_seconds(text: str) -> float | None:
    """Seconds of a duration such as `90s`, `36h`, `7d`, `1h30m` or `1.5h`; a plain number is
    seconds. None when `text` is neither. Units must not repeat and go largest first."""
    stripped = text.strip()
    try:
        return float(stripped)
    except ValueError:
        pass
    if not _DURATION_RE.match(stripped):
        return None
    parts = [(float(n), unit) for n, unit in _PART_RE.findall(stripped)]
    sizes = [_UNIT_S[unit] for _, unit in parts]
    if any(a <= b for a, b in itertools.pairwise(sizes)):
        return None
    return sum(n * _UNIT_S[unit] for n, unit in parts)


def parse_duration_s(value: Any, path: str) -> Any:
    if isinstance(value, str):
        seconds = duration_seconds(value)
        if seconds is None:
            raise ConfigFileError(
                f"{path}: {value!r} is not a duration (e.g. 90s, 30m, 36h, 7d, 1h30m)"
            )
        return seconds
    return value


def format_duration_s(seconds: float) -> str | float:
    """`seconds` in the largest one unit that divides it exactly (7d, 36h, 90m, 45s), which
    `duration_seconds` reads back; zero and fractions of a second stay a number."""
    if seconds <= 0 or seconds != int(seconds):
        return seconds
    for unit, size in _OUTPUT_UNITS:
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return seconds


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
        value = parse_duration_s(value, path)
    _check_kind(field, value, path)
    return value


_WHOLE = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_REAL = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})


def _parses(convert: type[int] | type[float], text: str) -> bool:
    try:
        convert(text)
    except ValueError:
        return False
    return True


def _check_kind(field: FieldDescriptor, value: Any, path: str) -> None:
    """Refuse a value of the wrong kind at its own path. Left to protobuf's parser, a value
    Python cannot convert (`gpu_count: eight`, a name YAML read as a number) was named by its
    field alone, without the list index that says which node or queue it is. Numbers written
    as text (`"8"`) stay accepted, as the parser accepts them."""
    if value is None:
        return
    kind, number = field.type, isinstance(value, int | float) and not isinstance(value, bool)
    text = isinstance(value, str)
    if kind in _WHOLE:
        if not ((number and float(value).is_integer()) or (text and _parses(int, value))):
            raise ConfigFileError(f"{path}: expected a whole number, got {_got(value)}")
    elif kind in _REAL:
        if not (number or (text and _parses(float, value))):
            raise ConfigFileError(f"{path}: expected a number, got {_got(value)}")
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ConfigFileError(f"{path}: expected true or false, got {_got(value)}")
    elif kind == FieldDescriptor.TYPE_STRING and not text:
        hint = "" if isinstance(value, list | dict) else f"; in YAML, write it in quotes: '{value}'"
        raise ConfigFileError(f"{path}: expected text, got {_got(value)}{hint}")


def _got(value: Any) -> str:
    return f"a {_SHAPES[type(value)]}" if type(value) in _SHAPES else repr(value)


_SHAPES: dict[type, str] = {list: "list", dict: "mapping"}


def parse_config(data: Any, source: str = "config") -> cluster_pb2.ClusterConfig:
    """A ClusterConfig from already-parsed YAML data; an error's message starts with `source`
    and names the field (`nodes[1].gpu_count: ...`)."""
    msg = cluster_pb2.ClusterConfig()
    try:
        json_format.ParseDict(_normalise(data or {}, cluster_pb2.ClusterConfig.DESCRIPTOR, ""), msg)
    except (ConfigFileError, json_format.ParseError) as exc:
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
        return parse_config(data, str(path))  # its errors name the file already
    except RecursionError:
        raise ConfigFileError(f"{path}: nested too deeply for a cluster config") from None


def short_enum(field: FieldDescriptor, name: str) -> str:
    """`WINDOW_KIND_SLIDING` -> `sliding`: the value without its enum's common prefix."""
    enum_type = field.enum_type
    assert enum_type is not None
    prefix = enum_type.values[0].name.removesuffix("UNSPECIFIED")
    return name.removeprefix(prefix).lower()


def _friendly(data: Any, descriptor: Any) -> Any:
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name[key]
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            out[key] = {k: _whole(v) for k, v in value.items()}
            continue
        values = value if field.is_repeated else [value]
        shown = [_friendly_scalar(field, v) for v in values]
        out[key] = shown if field.is_repeated else shown[0]
    return out


def _friendly_scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        if field.message_type.full_name.startswith("google.protobuf."):
            return value  # timestamps and the like keep their JSON form
        return _friendly(value, field.message_type)
    if field.type == FieldDescriptor.TYPE_ENUM and isinstance(value, str):
        return short_enum(field, value)
    if field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
        return int(value)
    if field.name.endswith("_s") and isinstance(value, int | float):
        return _whole(format_duration_s(float(value)))  # 0 as 0, as JSON writes it
    return _whole(value)


def _whole(value: Any) -> Any:
    """A float that is a whole number as an int (80, not 80.0), as a person writes it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def message_to_data(msg: Message, *, every_field: bool = False) -> Any:
    """The message as plain data in the file's short forms (see the module's docstring).

    Fields at their default (0, "", empty lists) are left out, as a config file leaves them
    out; `every_field` writes them too (a field with presence that is not set stays out), as
    `-o json` does, for replies a script reads: a queue's 0 GPU-hours is a 0, not a missing
    key (`cli/options.py`)."""
    data = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=every_field
    )
    return _friendly(data, msg.DESCRIPTOR)


def message_to_yaml(msg: Message) -> str:
    return yaml.safe_dump(message_to_data(msg), sort_keys=False)
