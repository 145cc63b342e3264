"""Staleness filter and backpressure on scripted version sequences."""

import pytest

from posttrain.rl.buffer import Backpressure, StalenessFilter


def test_staleness_filter_drops_and_counts():
    f = StalenessFilter(max_staleness=2)
    script = [(5, 5, True), (3, 5, True), (2, 5, False), (0, 5, False), (4, 6, True)]
    for sample_v, learner_v, keep in script:
        assert f.accept(sample_v, learner_v, n_samples=4) is keep
    assert f.dropped == 8 and f.kept == 12
    assert f.pop_window() == [0] * 4 + [2] * 4 + [2] * 4
    assert f.pop_window() == []


def test_sample_from_the_future_is_a_protocol_error():
    with pytest.raises(ValueError, match="ahead of the learner"):
        StalenessFilter(1).accept(7, 6)


def test_backpressure_blocks_when_max_staleness_ahead():
    bp = Backpressure(max_staleness=1)
    # (actor weights version, may generate?) as the actor produces batches 0, 1, 2, ...
    assert bp.may_generate(0)          # batch 0 with v0: 0 ahead
    bp.record_batch()
    assert bp.may_generate(0)          # batch 1 with v0: 1 ahead, allowed
    bp.record_batch()
    assert not bp.may_generate(0)      # batch 2 with v0: 2 ahead -> wait
    assert bp.version_needed() == 1
    assert bp.may_generate(1)
    bp.record_batch()
    assert not bp.may_generate(1) and bp.may_generate(2)


def test_zero_staleness_is_lock_step():
    bp = Backpressure(max_staleness=0)
    for j in range(4):  # batch j needs exactly version j
        assert bp.may_generate(j)
        if j:
            assert not bp.may_generate(j - 1)
        bp.record_batch()
