"""Settings: durations, precedence of flags over environment, start-up validation."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from extproc.cli import build_parser
from extproc.settings import Settings, parse_duration
from extproc.settings_sources import from_sources


@pytest.mark.parametrize("text, seconds", [
    ("300", 300.0), ("300s", 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25),
    (" 2.5s ", 2.5), (7, 7.0),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "nan", "inf", "-1s", "5x", "5m3", "m", "1e400"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flag_beats_environment_beats_default():
    env = {"MODELPOOL_SWAP_BUDGET": "2m", "MODELPOOL_NAMESPACES": "a,b",
           "MODELPOOL_IDLE_GATE": "true"}
    assert from_sources(_args(), env).swap_budget == 120.0
    settings = from_sources(_args("--swap-budget", "45s", "--namespace", "c",
                                  "--no-idle-gate"), env)
    assert (settings.swap_budget, settings.namespaces, settings.idle_gate) == (45.0, ["c"],
                                                                               False)
    assert from_sources(_args(), {}) == Settings()


@pytest.mark.parametrize("argv, complaint", [
    (("--route-template", "{model}"), "route_template"),
    (("--idle-probe-url", "http://{host}/slots"), "idle_probe_url"),
    (("--log-level", "verbose"), "log_level"),
    (("--tls-cert", "c.pem"), "--tls-cert and --tls-key"),
    (("--swap-budget", "nan"), "swap_budget"),
    (("--fairness-window=-5s",), "fairness_window"),
    (("--event-loop", "trio"), "event_loop"),
])
def test_settings_that_would_fail_per_request_fail_at_start(argv, complaint):
    with pytest.raises(SystemExit) as caught:
        from_sources(_args(*argv), {})
    assert complaint in str(caught.value)


@pytest.mark.parametrize("event_loop, kind", [("uvloop", "uvloop.Loop"),
                                              ("asyncio", "asyncio.unix_events")])
def test_the_service_runs_on_the_event_loop_it_is_given(event_loop, kind):
    from extproc.cli import run

    seen = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen.append(f"{type(loop).__module__}.{type(loop).__name__}")

    run(main(), event_loop)
    assert seen[0].startswith(kind)


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_help_lists_every_setting_with_its_default_and_variable(command, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, field in Settings.__dataclass_fields__.items():
        assert f"[env MODELPOOL_{name.upper()}]" in shown, name
    assert "(default: 300s)" in shown or "(default: 5m" in shown  # durations shown as durations
