"""A reply's size, counted as its results are encoded: exact once a batch is written, and never
more than `most_bytes` promised before (the bound a stream's messages are admitted by)."""

from __future__ import annotations

import random
import uuid

import pytest

from gpufair.api.event_results import (
    MAX_ERROR_BYTES,
    ReplyBudget,
    most_bytes,
    result_bytes,
    results_bytes,
)
from gpufair.api.ingest import _Message, _report
from gpufair.domain.errors import InvalidInputError
from gpufair.store.ingest_pipeline import EventStatus, Outcomes, PreparedBatch
from gpufair.v1 import ledger_pb2 as pb

IDS = [
    lambda rng: str(uuid.UUID(int=rng.getrandbits(128))),  # canonical, as clients send them
    lambda rng: "x" * rng.randrange(0, 130),  # around the short form's 123 bytes
    lambda rng: "é" * rng.randrange(1, 80),  # two UTF-8 bytes a character
]
ERRORS = ["", "stopped before the workload started", "e" * 600, "ü" * 300, "€" * 150]


def written(rng: random.Random, n: int) -> Outcomes:
    outcomes = Outcomes([rng.choice(IDS)(rng) for _ in range(n)])
    for i in range(n):
        roll = rng.random()
        if roll < 0.2:
            outcomes.reject(i, rng.choice(ERRORS))
        else:
            outcomes.statuses[i] = EventStatus.DUPLICATE if roll < 0.3 else EventStatus.STORED
    return outcomes


def reply_size(outcomes: Outcomes) -> int:
    """What the protobuf runtime counts for the reply `_report` builds of these outcomes."""
    batch = PreparedBatch(0.0, False, outcomes, [])
    message = _Message([], 0.0, batch, outcomes)
    reply = pb.ReportEventsResponse()
    _report(reply, message)
    return reply.ByteSize()


@pytest.mark.parametrize("seed", range(40))
def test_the_counted_size_is_the_reply_s_and_within_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    outcomes = written(rng, rng.randrange(0, 60))
    size = reply_size(outcomes)
    # The short form writes an empty id's field, which the runtime leaves out: 2 bytes more.
    empty = sum(1 for i, e in enumerate(outcomes.event_ids) if not e and not outcomes.errors.get(i))
    assert results_bytes(outcomes) == size + 2 * empty
    assert results_bytes(outcomes) <= most_bytes(outcomes.event_ids)


def test_canonical_ids_all_stored_count_42_bytes_each_and_are_bounded_by_446() -> None:
    ids = [str(uuid.UUID(int=k)) for k in range(1000)]
    outcomes = Outcomes(ids)
    outcomes.statuses[:] = [EventStatus.STORED] * 1000
    assert results_bytes(outcomes) == reply_size(outcomes) == 42_000
    assert most_bytes(ids) == 446_000
    # The bound is reached: every event rejected with an error of MAX_ERROR_BYTES.
    worst = Outcomes(ids)
    for i in range(1000):
        worst.reject(i, "r" * 1000)
    assert results_bytes(worst) == reply_size(worst) == 446_000


@pytest.mark.parametrize("error", ["e" * 600, "ü" * 300, "a" + "€" * 200])
def test_a_long_error_is_cut_to_max_error_bytes_on_a_character(error: str) -> None:
    result = pb.ReportEventsResponse.FromString(
        result_bytes("id", pb.EVENT_STATUS_REJECTED, error)
    ).results[0]
    cut = result.error.encode()
    assert MAX_ERROR_BYTES - 3 <= len(cut) <= MAX_ERROR_BYTES
    assert result.error.endswith("…") and error.startswith(result.error[:-1])


def test_a_budget_admits_what_fits_whatever_the_outcomes_and_counts_what_was_written() -> None:
    ids = [str(uuid.UUID(int=k)) for k in range(2)]
    budget = ReplyBudget(limit=900)
    budget.admit(ids, "messages[0]", 0)  # at most 892 bytes
    outcomes = Outcomes(ids)
    outcomes.statuses[:] = [EventStatus.STORED] * 2
    budget.spend(outcomes)
    assert budget.used == 84
    with pytest.raises(InvalidInputError) as refused:
        budget.admit(ids, "messages[1]", 1)  # 84 + 892 > 900
    ((field, why),) = refused.value.violations
    assert field == "messages[1]"
    assert "before this message (1 messages) is stored" in why
    budget.admit(ids[:1], "messages[1]", 1)  # 84 + 446 fits
