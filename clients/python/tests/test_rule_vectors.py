"""The client rules' shared test vectors (clients/conformance/rules.json,
written by tests/rule_vectors.rs from src/rules.rs) against `dlock.rules`:
a rule changed in one client and not in the others fails somewhere.

Times and durations in the file are microseconds; `dlock.rules` works in
nanoseconds, and a time it answers is compared in whole microseconds, as
the Rust side wrote it (`Duration::as_micros`, which truncates)."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

import pytest

from conftest import REPO
from dlock import rules
from dlock.liveness import silence_limit
from dlock._proto import dlock_pb2 as pb

VECTORS_FILE = REPO / "clients" / "conformance" / "rules.json"
VECTORS: Dict[str, Any] = json.loads(VECTORS_FILE.read_text())

SECTIONS = [
    "deadline",
    "margin",
    "in_jeopardy",
    "moves_deadline",
    "elsewhere",
    "kinds",
    "unanswered_too_long",
    "session_lives_until",
    "holds",
    "silence_limits",
    "gone_silent",
]


def ns(us: int) -> int:
    return us * 1_000


def us(ns_: int) -> int:
    assert ns_ >= 0
    return ns_ // 1_000


def kind(name: str) -> int:
    return pb.RequestType.Value(name)


def status(name: str) -> int:
    return pb.ResponseStatus.Value(name)


def check_deadline(case: Dict[str, Any]) -> None:
    assert us(rules.deadline(ns(case["sent_us"]), ns(case["window_us"]))) == case["deadline_us"]


def check_margin(case: Dict[str, Any]) -> None:
    assert us(rules.margin(ns(case["configured_us"]), ns(case["window_us"]))) == case["margin_us"]


def check_in_jeopardy(case: Dict[str, Any]) -> None:
    got = rules.in_jeopardy(ns(case["now_us"]), ns(case["deadline_us"]), ns(case["margin_us"]))
    assert got is case["jeopardy"]


def check_moves_deadline(case: Dict[str, Any]) -> None:
    got = rules.moves_deadline(case["on_session"], kind(case["kind"]), status(case["status"]))
    assert got is case["moves_deadline"]


def check_elsewhere(case: Dict[str, Any]) -> None:
    got = rules.elsewhere(status(case["status"]), case["leader"])
    if case["means"] is None:
        assert got is None
        return
    assert got is not None
    assert got.means == case["means"]
    assert got.leader == case["moves_to"]


def check_kinds(case: Dict[str, Any]) -> None:
    k = kind(case["kind"])
    assert rules.session_use(k) == (case["acts_for_session"], case["numbered"])
    assert rules.may_wait(k) is case["may_wait"]


def check_unanswered_too_long(case: Dict[str, Any]) -> None:
    got = rules.unanswered_too_long(kind(case["kind"]), ns(case["waited_us"]), ns(case["ttl_us"]))
    assert got is case["too_long"]


def check_session_lives_until(case: Dict[str, Any]) -> None:
    got = rules.session_lives_until(ns(case["acked_us"]), ns(case["broke_us"]), ns(case["ttl_us"]))
    assert us(got) == case["until_us"]


def check_holds(case: Dict[str, Any]) -> None:
    granted = case["granted"]
    lease = granted["lease_us"]
    hold = rules.Hold.granted(ns(granted["sent_us"]), None if lease is None else ns(lease))
    for step in case["steps"]:
        [(what, arg)] = step.items()
        sent, lease_ = ns(arg["sent_us"]), ns(arg["lease_us"])
        if what == "renew_sent":
            hold.renew_sent(sent, lease_)
        elif what == "renew_answered":
            hold.renew_answered(sent, lease_)
        else:
            raise AssertionError(f"unknown step {what!r}")
    acked, timeout = ns(case["owner_acked_us"]), ns(case["owner_timeout_us"])
    assert us(hold.deadline(acked, timeout)) == case["deadline_us"]
    assert (None if hold.lease is None else us(hold.lease[1])) == case["lease_us"]
    assert us(hold.window(timeout)) == case["window_us"]
    renewal = case["renewal"]
    assert hold.renewal() == (None if renewal is None else (renewal["at_ns"], ns(renewal["lease_us"])))


def check_silence_limits(case: Dict[str, Any]) -> None:
    election = case["election_timeout_us"]
    got = rules.silence_limit(None if election is None else ns(election), ns(case["ttl_us"]))
    assert us(got) == case["limit_us"], f"{got} ns"
    # `dlock.liveness` works in float seconds, and the node's word reaches
    # it as `Limits.election_timeout` does (None when it states none; 0
    # reads the same): within a microsecond of the rule.
    seconds = silence_limit(None if election is None else election / 1e6, case["ttl_us"] / 1e6)
    assert abs(seconds * 1e6 - case["limit_us"]) < 1, f"{seconds} s"


def check_gone_silent(case: Dict[str, Any]) -> None:
    got = rules.gone_silent(ns(case["last_heard_us"]), ns(case["now_us"]), ns(case["limit_us"]))
    assert got == case["gone"], got


CHECKS: Dict[str, Callable[[Dict[str, Any]], None]] = {
    "deadline": check_deadline,
    "margin": check_margin,
    "in_jeopardy": check_in_jeopardy,
    "moves_deadline": check_moves_deadline,
    "elsewhere": check_elsewhere,
    "kinds": check_kinds,
    "unanswered_too_long": check_unanswered_too_long,
    "session_lives_until": check_session_lives_until,
    "holds": check_holds,
    "silence_limits": check_silence_limits,
    "gone_silent": check_gone_silent,
}


def test_the_clock_rate_bound_is_the_rules():
    assert rules.CLOCK_RATE_BOUND == VECTORS["clock_rate_bound"]


def test_every_section_of_the_file_is_checked():
    known = {"about", "clock_rate_bound", *SECTIONS}
    assert set(VECTORS) == known, f"sections the test does not know or misses: {set(VECTORS) ^ known}"


@pytest.mark.parametrize("section", SECTIONS)
def test_the_rules_answer_as_the_vectors_say(section: str) -> None:
    cases: List[Dict[str, Any]] = VECTORS.get(section) or []
    assert cases, f"rules.json has no {section} vectors: this test would check nothing"
    failures = []
    for i, case in enumerate(cases):
        try:
            CHECKS[section](case)
        except AssertionError as e:
            failures.append(f"{section} case {i} {json.dumps(case)}: {e}")
    assert not failures, f"{len(failures)} of {len(cases)} {section} vectors fail:\n" + "\n".join(failures)
