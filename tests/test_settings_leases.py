"""The Lease settings: defaults a reviewer can check against client-go's leader election
(15 s / 10 s / 2 s) and docs/design/replicas.md's membership (~10 s renewed every ~2 s), flags
and environment, and the combinations refused at start-up."""

from __future__ import annotations

import pytest

from extproc.cli import build_parser
from extproc.settings import ConfigError, Settings
from extproc.settings_sources import from_sources

# k8s.io/client-go/tools/leaderelection: LeaseDuration, RenewDeadline, RetryPeriod as documented
CLIENT_GO = (15.0, 10.0, 2.0)


def test_defaults_match_client_go_and_ha_md():
    settings = Settings()
    assert (settings.leader_lease_duration, settings.leader_renew_deadline,
            settings.leader_retry) == CLIENT_GO
    assert (settings.membership_lease_duration, settings.membership_renew) == (10.0, 2.0)
    # a replica fails closed before its peers may count it lost: duration - margin < duration + margin
    assert settings.lease_margin > 0
    assert settings.membership_lease_name.format(replica="pod-1") == "modelpool-extproc-pod-1"
    assert settings.leader_lease_name == "modelpool-extproc-leader"  # one for the replica set


def test_flags_and_environment_set_the_timings():
    args = build_parser().parse_args(["serve", "--membership-renew", "500ms",
                                      "--leader-lease-duration", "20s"])
    settings = from_sources(args, {"MODELPOOL_LEASE_MARGIN": "1.5s"})
    assert (settings.membership_renew, settings.leader_lease_duration, settings.lease_margin) == \
        (0.5, 20.0, 1.5)


@pytest.mark.parametrize("environ, says", [
    ({"MODELPOOL_MEMBERSHIP_LEASE_DURATION": "2.5s"}, "whole seconds"),
    ({"MODELPOOL_LEADER_LEASE_DURATION": "0s"}, "whole seconds"),
    ({"MODELPOOL_MEMBERSHIP_RENEW": "8s"}, "below the membership duration - margin"),
    ({"MODELPOOL_LEADER_RENEW_DEADLINE": "15s"}, "--leader-renew-deadline < --leader-lease-duration"),
    ({"MODELPOOL_LEADER_RETRY": "0s"}, "0 < --leader-retry"),
    ({"MODELPOOL_LEADER_LEASE_NAME": "modelpool-extproc-leader.{namespace}.{pool}"},
     "one Lease name for the replica set"),
])
def test_unworkable_timings_are_refused(environ, says):
    with pytest.raises(ConfigError) as refused:
        from_sources(None, environ)
    assert says in str(refused.value)
