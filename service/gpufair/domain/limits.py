"""Every input limit of the API, in one place, and the small checks that apply them.

A value outside these bounds is INVALID_ARGUMENT with the field named, never an overflow deep in
the fair-share arithmetic or a database error: numbers are finite and in a range a real cluster
needs (with room to spare), instants lie in the years 1970-9999, strings are bounded and carry
no NUL or other control character (PostgreSQL cannot store NUL in text; the others are never
meant and make logs and tables lie), lists are bounded, the queue tree is shallow. The proto
comments state the same numbers; change both together.

Error output is bounded too: a violation list shows its first MAX_VIOLATIONS_SHOWN entries and one
"and N more" entry, and no message echoes more than MAX_ECHO_CHARS of what the caller sent, so a
status always fits in gRPC's metadata limit and stays readable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from gpufair.domain.errors import Violation

# Instants: 1970-01-01T00:00:00Z .. 9999-12-31T23:59:59Z, in Unix seconds.
MIN_UNIX_S = 0
MAX_UNIX_S = 253_402_300_799

# Durations (windows, half-lives, intervals, runtimes): positive ones at least a millisecond,
# all at most 10 years.
MIN_DURATION_S = 0.001
MAX_DURATION_S = 10 * 366 * 86_400.0

# GPU types and their slices.
MIN_COMPUTE_WEIGHT = 0.001  # CU per GPU
MAX_COMPUTE_WEIGHT = 10_000.0
MIN_GPU_MEMORY_GIB = 0.001
MAX_GPU_MEMORY_GIB = 65_536.0
MIN_GPU_FRACTION = 0.001  # the smallest share of one GPU a slice or a pod may ask for
MAX_PARTITION_PROFILES = 64

# Quotas, limits, weights and budgets.
MAX_CU = 1e9  # deserved_cu, limit_cu
MAX_GPUS = 1e7  # deserved_gpus_by_type, limit_gpus_by_type
MAX_OVER_QUOTA_WEIGHT = 1e6
MAX_K = 1_000.0
MAX_BUDGET_CU_HOURS = 1e12
MAX_GPU_TYPES_PER_MAP = 256  # entries of one *_gpus_by_type map

# Nodes and workloads.
MAX_GPUS_PER_NODE = 1024
MAX_CPU_MILLICORES = 10**9  # a node's, or one pod's
MAX_MEMORY_MIB = 10**12  # a node's, or one pod's
MAX_LABELS_PER_NODE = 64
MAX_PODS = 100_000
MIN_COMPUTE_UNITS = 0.001  # a compute-unit request (Workload.compute_units)
MAX_COMPUTE_UNITS = 1_000_000.0
MAX_MEMORY_SLICES = 32  # slices of one partitionable GPU (an A100 has 8)
MAX_GPUS_PER_POD = 64
MAX_ALLOWED_GPU_TYPES = 64

# Strings.
MAX_NAME_LEN = 63  # GPU types, pools, queues, partition profiles
MAX_NODE_NAME_LEN = 253
MAX_UID_LEN = 253  # workload uids
MAX_LABEL_KEY_LEN = 63
MAX_TOPOLOGY_LEVELS = 8  # NodePool.topology_levels
MAX_LABEL_VALUE_LEN = 253
MAX_TEXT_LEN = 253  # any other short string: a topology level, a kind, a state
MAX_REQUEST_ID_LEN = 200

# Lists and trees.
MAX_OBJECTS = 100_000  # objects of one config, names of one DeleteObjects or SetNodesReady
MAX_NODES_PER_UPSERT = 100_000
MAX_PRUNE_POOLS = 1_000
MAX_WORKLOADS_PER_BATCH = 10_000
MAX_EVENTS_PER_BATCH = 50_000
# Of a gRPC message either way, and so of a reply: a stream's reply, a result per event, too.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_QUEUE_DEPTH = 16
MAX_PAGE_SIZE = 10_000
DEFAULT_PAGE_SIZE = 1_000
MAX_PAGE_TOKEN_LEN = 2_048  # tokens are issued by gpufair: a sort key and a digest, encoded

# Error output.
MAX_VIOLATIONS_SHOWN = 20
MAX_ECHO_CHARS = 80  # of a caller's value quoted in a message
MAX_FIELD_PATH_CHARS = 160
MAX_DESCRIPTION_CHARS = 240
MAX_MESSAGE_CHARS = 1_000

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def echo(value: object) -> str:
    """`value` as a message may quote it: repr'd, and cut to MAX_ECHO_CHARS with a mark."""
    text = repr(value)
    if len(text) <= MAX_ECHO_CHARS:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[: MAX_ECHO_CHARS - 1]}… ({length} characters)"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_violations(
    path: str, value: str, max_len: int = MAX_TEXT_LEN, *, required: bool = False
) -> list[Violation]:
    """A string's length and characters: at most `max_len`, no NUL or control characters."""
    if not value:
        return [Violation(path, "is required")] if required else []
    if len(value) <= max_len and value.isprintable():  # the common case, in C
        return []
    if len(value) > max_len:
        return [Violation(path, f"longer than {max_len} characters ({len(value)})")]
    bad = _CONTROL_RE.search(value)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "a control character"
        return [Violation(path, f"contains {what} (U+{ord(bad.group()):04X})")]
    return []


def texts_violations(
    path: str, values: Sequence[str], max_count: int, max_len: int = MAX_TEXT_LEN
) -> list[Violation]:
    """A list of strings: at most `max_count`, each as `text_violations` wants it, none empty."""
    if len(values) > max_count:
        return [Violation(path, f"more than {max_count} entries ({len(values)})")]
    out: list[Violation] = []
    for i, value in enumerate(values):
        out += text_violations(f"{path}[{i}]", value, max_len, required=True)
    return out


def number_violations(
    path: str, value: float, lo: float, hi: float, *, lo_open: bool = False
) -> list[Violation]:
    """A finite number in [lo, hi] (or (lo, hi] with `lo_open`)."""
    kind = type(value)
    if (kind is float or kind is int) and lo <= value <= hi and not (lo_open and value == lo):
        return []  # the common case (NaN and infinities fail the comparisons)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return [Violation(path, f"must be a finite number, got {echo(value)}")]
    if value < lo or (lo_open and value == lo) or value > hi:
        low = "(" if lo_open else "["
        return [Violation(path, f"must be in {low}{lo:g}, {hi:g}], got {value:g}")]
    return []


def instant_violations(path: str, seconds: float) -> list[Violation]:
    """An instant in Unix seconds within the years 1970-9999."""
    if not math.isfinite(seconds) or not MIN_UNIX_S <= seconds <= MAX_UNIX_S:
        return [Violation(path, "must be an instant between 1970-01-01 and 9999-12-31 (UTC)")]
    return []


def timestamp_violations(path: str, seconds: int, nanos: int) -> list[Violation]:
    """A google.protobuf.Timestamp's fields: seconds in 1970-9999, nanos in [0, 1e9)."""
    if not 0 <= nanos < 1_000_000_000:
        return [Violation(f"{path}.nanos", "must be in [0, 999999999]")]
    return instant_violations(path, seconds)


def capped(violations: Sequence[Violation]) -> tuple[Violation, ...]:
    """The first MAX_VIOLATIONS_SHOWN violations, each cut to bounded length, plus one entry
    saying how many more there are (named by the field of the first one left out)."""
    shown = [
        Violation(
            shorten(v.field_path, MAX_FIELD_PATH_CHARS), shorten(v.message, MAX_DESCRIPTION_CHARS)
        )
        for v in violations[:MAX_VIOLATIONS_SHOWN]
    ]
    more = len(violations) - len(shown)
    if more > 0:
        first_left = shorten(violations[len(shown)].field_path, MAX_FIELD_PATH_CHARS)
        shown.append(Violation(first_left, f"and {more} more violations like the above"))
    return tuple(shown)


def summary(violations: Iterable[Violation], shown: int = 5) -> str:
    """One line for a status message: the first few violations and how many more."""
    listed = list(violations)
    text = "; ".join(f"{v.field_path}: {v.message}" for v in listed[:shown])
    more = len(listed) - shown
    return shorten(text + (f"; and {more} more" if more > 0 else ""), MAX_MESSAGE_CHARS)
