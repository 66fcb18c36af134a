"""daliload.failures: one failure budget and one replacement rule for every decoder."""

from __future__ import annotations

import pickle
import warnings

import pytest

from daliload.failures import (DecodeFailureWarning, Failure, FailureBudget, NoReplacementError, TooManyFailuresError,
                               replacement_order)


def test_replacement_order_is_the_next_slots_wrapping_around():
    assert list(replacement_order(5, 3)) == [3, 4, 0, 1, 2]
    assert list(replacement_order(1, 0)) == [0]
    with pytest.raises(ValueError, match="slot 5 out of range for a plan of 5 samples"):
        list(replacement_order(5, 5))


def test_budget_counts_each_path_and_position_once():
    budget = FailureBudget(100)
    assert budget.record(Failure("a.mp4", "cannot open", 3))
    assert not budget.record(Failure("a.mp4", "cannot open again", 3))  # met again as a candidate
    assert budget.record(Failure("a.mp4", "cannot open", 7))  # the same file in another slot counts
    assert [(f.path, f.position) for f in budget.failures] == [("a.mp4", 3), ("a.mp4", 7)]
    assert budget.failures[0].reason == "cannot open"  # the first reason is kept


def test_budget_allows_at_least_one_failure_then_raises_listing_them():
    budget = FailureBudget(10, max_fraction=0.05)  # 0.5 samples: at least one allowed
    budget.record(Failure("a.mp4", "truncated", 0))
    with pytest.raises(TooManyFailuresError, match=r"2 of 10 samples failed to decode, more than "
                                                   r"max_failure_fraction=0.05 of 10 samples") as info:
        budget.record(Failure("b.mp4", "garbage", 1))
    assert "b.mp4 (position 1): garbage" in str(info.value)
    assert [f.path for f in info.value.failures] == ["a.mp4", "b.mp4"]
    with pytest.warns(DecodeFailureWarning, match="2 of 10 samples failed to decode, more than the limit allows, "
                                                  "and the pass stopped"):
        budget.warn()  # not "replaced": the epoch stopped


def test_budget_count_limit_and_no_limit():
    counted = FailureBudget(10, max_fraction=None, max_count=0)
    with pytest.raises(TooManyFailuresError, match="1 of 10 samples failed to decode, more than max_failures=0"):
        counted.record(Failure("a.mp4", "x", 0))
    never = FailureBudget(3, max_fraction=1.0)
    for i in range(3):
        never.record(Failure(f"{i}.mp4", "x", i))
    assert len(never.failures) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"max_fraction": 1.5}, r"max_failure_fraction must be in \[0, 1\] or None, got 1.5"),
    ({"max_count": -1}, r"max_failures must be an integer >= 0 or None, got -1"),
])
def test_budget_limits_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FailureBudget(10, **kwargs)


def test_budget_warns_once_per_epoch_and_reset_starts_a_new_one():
    budget = FailureBudget(8, max_fraction=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        budget.warn()  # nothing failed: no warning
        budget.record(Failure("a.mp4", "timeout: decoding took longer than 1 s", 2))
        budget.record(Failure("b.mp4", "worker died (signal SIGKILL) while decoding this sample", 3))
        budget.record_replacement(2, 4)
        budget.warn(detail="1 worker restarts")
        budget.warn()
        budget.reset(8)
        budget.warn()
    assert len(caught) == 1
    warning = caught[0]
    assert issubclass(warning.category, DecodeFailureWarning)
    assert issubclass(warning.category, RuntimeWarning) and issubclass(warning.category, UserWarning)
    assert str(warning.message).startswith(
        "2 of 8 samples failed to decode and were replaced (1 timeouts, 1 worker deaths, 1 worker restarts); "
        "first: a.mp4: timeout")
    assert budget.failures == () and budget.replacements == ()


def test_errors_survive_pickling_across_processes():
    failures = (Failure("a.mp4", "x", 1), Failure("b.mp4", "y", 2))
    error = pickle.loads(pickle.dumps(NoReplacementError(1, failures)))
    assert error.failures == failures and "plan position 1: no decodable replacement" in str(error)
    # torch re-raises a worker's exception as type(message): the type must survive that too
    assert isinstance(NoReplacementError("plan position 1: ..."), NoReplacementError)
