"""runtime.lease: a server serves one run at a time; the holder renews and releases it,
and a holder that died frees it after the lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.lease import LeaseHeld, RunLease, lease_s_from_env, owner_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_another_run_is_refused_until_the_holder_releases_or_goes_silent_for_the_lease():
    clock = Clock()
    lease = RunLease(lease_s=300.0, clock=clock)
    assert lease.free_in_s() == 0
    lease.claim("run-a")
    lease.claim("run-a")  # the same run again (a rejoin, a resume): allowed
    clock.now += 200
    with pytest.raises(LeaseHeld, match=r"owner run-a, last call 200 s ago.*100 s from now"):
        lease.claim("run-b")
    lease.renew()  # run-a pushed
    clock.now += 299
    assert lease.free_in_s() == pytest.approx(1.0)
    with pytest.raises(LeaseHeld):
        lease.claim(None)  # an anonymous join too
    clock.now += 1
    lease.claim("run-b")  # run-a silent for the whole lease: it died
    assert (lease.owner, lease.free_in_s()) == ("run-b", 300.0)
    assert not lease.release("run-a") and lease.owner == "run-b"  # only the holder releases
    assert lease.release("run-b") and lease.owner is None
    lease.claim("run-c")  # at once


def test_an_owner_is_its_run_directory_and_the_lease_comes_from_the_environment(
    tmp_path, monkeypatch
):
    assert owner_of(tmp_path / "run") == owner_of(Path(str(tmp_path) + "/./run"))
    assert owner_of(tmp_path / "run") != owner_of(tmp_path / "other")
    monkeypatch.delenv("TANDEM_LEASE_S", raising=False)
    assert lease_s_from_env() == 300.0
    monkeypatch.setenv("TANDEM_LEASE_S", "30")
    assert lease_s_from_env() == 30.0
    monkeypatch.setenv("TANDEM_LEASE_S", "-1")
    with pytest.raises(ValueError, match="TANDEM_LEASE_S='-1'"):
        lease_s_from_env()


def test_only_the_holder_renews_and_a_renewal_from_another_run_names_the_holder():
    clock = Clock()
    lease = RunLease(lease_s=300.0, clock=clock)
    with pytest.raises(LeaseHeld, match="owner run-a does not hold this server \\(nobody does\\)"):
        lease.renew_by("run-a")  # a free server: a renewal takes nothing
    assert lease.owner is None
    lease.claim("run-a")
    clock.now += 250
    lease.renew_by("run-a")
    assert lease.free_in_s() == 300.0
    clock.now += 100
    with pytest.raises(LeaseHeld, match="owner run-b does not hold this server \\(owner run-a"):
        lease.renew_by("run-b")
    with pytest.raises(LeaseHeld):
        lease.renew_by(None)
    assert (lease.owner, lease.free_in_s()) == ("run-a", 200.0)  # as it was
    clock.now += 400
    lease.renew_by("run-a")  # lapsed, but no other run took it: still its own
    assert lease.free_in_s() == 300.0


def test_a_renewal_comes_every_third_of_the_lease():
    from runtime.lease_keeper import IDLE_RENEW_EVERY_S, renew_every_s

    assert renew_every_s(300.0) == 100.0
    assert renew_every_s(0.0) == IDLE_RENEW_EVERY_S  # no lease to keep: ask now and then
    assert renew_every_s(0.01) == pytest.approx(0.1)
