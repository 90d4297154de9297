"""Failures on Ray workers reach the driver with the worker's rank and the driver's line; a
worker that dies fails the call within a bounded time, never a hang."""

import time

import pytest

import twinkle
from twinkle import DeviceGroup
from twinkle.infra import EarlierCallError, RemoteError, reset
from twinkle.infra.ray import runtime as ray_runtime


@pytest.fixture(scope="module")
def shard(ray_cluster):
    from ray_components import Shard

    twinkle.initialize("ray", groups=[DeviceGroup(name="model", ranks=2, device_type="cpu")])
    yield Shard(remote_group="model")
    ray_runtime.shutdown()
    reset()


def line_of(text: str) -> str:
    """'test_ray_errors.py:<line>' of the first line of this file containing ``text``."""
    with open(__file__) as source:
        number = next(i for i, line in enumerate(source, 1) if text in line)
    return f"test_ray_errors.py:{number}"


def test_an_exception_names_the_rank_the_group_and_the_calling_line(shard):
    with pytest.raises(RemoteError) as caught:
        shard.fail_on(1)  # the failing call
    message = str(caught.value)
    assert "Shard.fail_on failed on worker rank 1 of group 'model'" in message
    assert line_of("shard.fail_on(1)  # the failing call") in message
    assert "ValueError: bad input on rank 1" in message and "--- traceback on the worker" in message
    assert isinstance(caught.value.__cause__, ValueError)
    assert (caught.value.rank, caught.value.group) == (1, "model")
    assert shard.first_rank() == 0  # the group carries on after an exception


def test_a_failed_lazy_call_is_reported_at_the_next_call_with_its_own_line(shard):
    pending = shard.lazy_fail_on(0)  # the lazy call
    time.sleep(1.0)
    with pytest.raises(RemoteError) as caught:
        shard.first_rank()
    message = str(caught.value)
    assert "Shard.lazy_fail_on failed on worker rank 0" in message
    assert line_of("shard.lazy_fail_on(0)  # the lazy call") in message
    with pytest.raises(RemoteError, match="KeyError"):
        pending.resolve()  # reading the result raises the same error
    assert shard.first_rank() == 0  # reported once


def test_a_lazy_failure_reported_at_a_construction_names_the_failed_call_not_the_next(shard):
    """The issue's case: a lazy call fails, then an unrelated component is built. The error
    leads with the call that failed and its line, says the construction did not run, and
    the construction, tried again, is not blamed: it runs."""
    from ray_components import Numbers

    shard.lazy_fail_on(1)  # the set_optimizer that fails
    time.sleep(1.0)
    with pytest.raises(EarlierCallError) as caught:
        Numbers(6, 2, remote_group="model")  # the next, unrelated call
    error, message = caught.value, str(caught.value)
    assert message.startswith("Shard.lazy_fail_on failed on worker rank 1 of group 'model'")
    assert line_of("shard.lazy_fail_on(1)  # the set_optimizer that fails") in message
    assert "KeyError: 'lazy failure'" in message.splitlines()[0]
    number = line_of("# the next, unrelated call").split(":")[1]
    reported_at = f"Numbers(...) at {__file__}:{number} in "
    assert f"before the next remote call, {reported_at}" in message
    assert "which did not run and is not at fault" in message
    assert (error.failed_call, error.rank, error.group) == ("Shard.lazy_fail_on", 1, "model")
    assert error.reported_at.startswith(reported_at)
    assert isinstance(error, RemoteError) and isinstance(error.__cause__, KeyError)
    numbers = Numbers(6, 2, remote_group="model")  # reported once: the retry runs
    assert len(numbers) == 3


def test_a_lazy_failure_read_from_its_result_is_not_reported_again(shard):
    pending = shard.lazy_fail_on(0)
    with pytest.raises(RemoteError, match="KeyError") as caught:
        pending.resolve()  # the caller reads the result and gets the failure here
    assert not isinstance(caught.value, EarlierCallError)
    time.sleep(0.5)
    assert shard.first_rank() == 0  # the next call is not blamed for it


def test_sync_waits_and_raises_at_the_call(shard):
    with pytest.raises(RemoteError, match="sync failure on rank 1"):
        shard.sync_fail(1)
    assert list(shard.sync_fail(-1)) == [0, 1]


def test_a_constructor_error_names_the_class_and_the_line(shard):
    from ray_components import Numbers

    with pytest.raises(RemoteError) as caught:
        Numbers("three", 1, remote_group="model")  # a bad constructor call
    assert "Numbers(...) failed on worker rank 0" in str(caught.value)
    assert line_of('Numbers("three", 1, remote_group="model")') in str(caught.value)


def test_a_worker_killed_mid_call_fails_the_call_quickly(shard):
    start = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        shard.die_on(1)  # rank 0 waits in a barrier for the rank that dies
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"the call took {elapsed:.1f} s to fail"
    message = str(caught.value)
    assert "worker rank 1 of group 'model' died during Shard.die_on" in message
    assert line_of("shard.die_on(1)") in message
    with pytest.raises(RemoteError, match="group 'model' is stopped: worker rank 1 died"):
        shard.first_rank()
