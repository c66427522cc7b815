"""`PendingEncoder` builds the same `Schedule` reply bytes as a message per pending workload,
across cycles in which reasons change, workloads come and go, and the kept map starts over."""

from __future__ import annotations

from gpufair.api.convert_schedule import PendingEncoder, result_to_proto
from gpufair.domain.snapshot import CycleResult, PendingCode, PendingReason

OVER = PendingReason(PendingCode.OVER_FAIR_SHARE, "queue llm is 12 CU over its fair share")
NO_FIT = PendingReason(PendingCode.NO_CAPACITY, "no node has 8 free A100s")


def result(pending: dict[str, PendingReason]) -> CycleResult:
    return CycleResult(binds=(), evicts=(), pending=pending)


def test_the_encoded_reply_is_byte_for_byte_the_built_one() -> None:
    encoder = PendingEncoder(limit=5)
    cycles = [
        {f"w{i:02d}": OVER for i in range(4)},
        {f"w{i:02d}": OVER if i % 2 else NO_FIT for i in range(4)},  # reasons changed
        {"w03": NO_FIT, "w10": OVER, "é-unicode": NO_FIT},  # gone, new, non-ASCII
        {f"x{i}": OVER for i in range(7)},  # past the limit: the map starts over
        {
            "w03": PendingReason(PendingCode.NO_CAPACITY, "no node has 8 free A100s")
        },  # equal, new object
    ]
    for pending in cycles:
        built = result_to_proto("main", result(pending), 1_700_000_000.5, 7)
        encoded = result_to_proto("main", result(pending), 1_700_000_000.5, 7, encoder)
        assert encoded.SerializeToString() == built.SerializeToString()
        assert [p.uid for p in encoded.pending] == sorted(pending)
        assert [p.message for p in encoded.pending] == [pending[u].message for u in sorted(pending)]
