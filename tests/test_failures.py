"""daliload.failures: one failure budget and one replacement rule for every decoder."""

from __future__ import annotations

import pickle
import warnings

import pytest

from daliload.failures import (DecodeFailureWarning, FailedVideo, Failure, FailureBudget, NoReplacementError,
                               TooManyFailuresError, replacement_order)


def test_replacement_order_is_the_next_slots_wrapping_around():
    assert list(replacement_order(5, 3)) == [3, 4, 0, 1, 2]
    assert list(replacement_order(1, 0)) == [0]
    with pytest.raises(ValueError, match="slot 5 out of range for a plan of 5 samples"):
        list(replacement_order(5, 5))


def test_budget_counts_each_video_once_with_every_position_it_failed_at():
    budget = FailureBudget(100)
    assert budget.record(Failure("a.mp4", "cannot open", 3))
    assert not budget.record(Failure("a.mp4", "cannot open again", 3))  # met again as a candidate
    assert not budget.record(Failure("a.mp4", "cannot open", 7))  # another slot of the same video (a view, a pad)
    assert budget.record(Failure("b.mp4", "garbage", 9))
    assert budget.failures == (FailedVideo("a.mp4", "cannot open", (3, 7)), FailedVideo("b.mp4", "garbage", (9,)))
    assert budget.failures[0].describe() == "a.mp4 (positions 3, 7): cannot open"  # the first reason is kept


def test_a_video_with_thirty_failed_views_is_one_failure_listed_once():
    budget = FailureBudget(8, max_fraction=0.05)  # 0.4 videos: one allowed
    for view in range(30):
        budget.record(Failure("v.mp4", "truncated", 12 + view))
    assert len(budget.failures) == 1
    assert budget.failures[0].describe() == "v.mp4 (positions 12-41): truncated"


def test_budget_allows_at_least_one_video_then_raises_listing_them_once_each():
    budget = FailureBudget(10, max_fraction=0.05)  # 0.5 videos: at least one allowed
    budget.record(Failure("a.mp4", "truncated", 0))
    budget.record(Failure("a.mp4", "truncated", 10))  # its padding repeat: the same video
    with pytest.raises(TooManyFailuresError, match=r"2 of 10 videos failed to decode, more than "
                                                   r"max_failure_fraction=0.05 of 10 videos \(1 allowed\)") as info:
        budget.record(Failure("b.mp4", "garbage", 1))
    assert "a.mp4 (positions 0, 10): truncated" in str(info.value)
    assert "b.mp4 (position 1): garbage" in str(info.value)
    assert str(info.value).count("a.mp4") == 1
    assert [f.path for f in info.value.failures] == ["a.mp4", "b.mp4"]
    with pytest.warns(DecodeFailureWarning, match="2 of 10 videos failed to decode, more than the limit allows, "
                                                  "and the pass stopped"):
        budget.warn()  # not "replaced": the epoch stopped


def test_budget_of_every_video_never_raises():
    never = FailureBudget(3, max_fraction=1.0)
    for i in range(3):
        never.record(Failure(f"{i}.mp4", "x", i))
    assert len(never.failures) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"max_fraction": 1.5}, r"max_failure_fraction must be in \[0, 1\] or None, got 1.5"),
])
def test_budget_limits_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FailureBudget(10, **kwargs)


def test_budget_warns_once_per_epoch_and_reset_starts_a_new_one():
    budget = FailureBudget(8, max_fraction=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        budget.warn()  # nothing failed: no warning
        budget.record(Failure("a.mp4", "timeout: decoding took longer than 1 s", 2, "timeout"))
        budget.record(Failure("b.mp4", "worker died (signal SIGKILL) while decoding this sample", 3, "crash"))
        budget.record_replacement(2, 4)
        budget.warn()
        budget.warn()
        budget.reset(8)
        budget.warn()
    assert len(caught) == 1
    warning = caught[0]
    assert issubclass(warning.category, DecodeFailureWarning)
    assert issubclass(warning.category, RuntimeWarning) and issubclass(warning.category, UserWarning)
    assert str(warning.message).startswith(
        "2 of 8 videos failed to decode and were replaced (1 timeouts, 1 worker deaths); "
        "first: a.mp4 (position 2): timeout")
    assert budget.failures == () and budget.replacements == ()


def test_errors_survive_pickling_across_processes():
    failures = (Failure("a.mp4", "x", 1), Failure("b.mp4", "y", 2))
    error = pickle.loads(pickle.dumps(NoReplacementError(1, failures)))
    assert error.failures == failures and "plan position 1: no decodable replacement" in str(error)
