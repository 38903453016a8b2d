"""The fan-out engine's rule for one look at a child run (tasks/fanout/decisions.py): no server, no training."""

import pytest
from prefect.states import Cancelled, Cancelling, Completed, Crashed, Failed, Paused, Pending, Running, Scheduled

from tasks.fanout.decisions import MAX_RERUNS, RerunRule, Verdict, decide

RULE = RerunRule(max_reruns=2, timeout_s=60.0)


def test_a_completed_child_is_done_and_a_waiting_or_running_one_is_left_alone():
    assert decide(Completed(), 0.0, 0, RULE).verdict is Verdict.COMPLETED
    assert decide(Completed(), 0.0, 0, RULE).settled
    for state in (None, Scheduled(), Pending(), Paused(), Cancelling()):
        assert decide(state, 0.0, 0, RULE).verdict is Verdict.WAITING, state
    running = decide(Running(), 59.0, 0, RULE)
    assert running.verdict is Verdict.RUNNING and not running.settled


def test_a_crashed_child_is_run_again_until_its_budget_is_spent():
    again = decide(Crashed(message="No heartbeat"), 0.0, 1, RULE)
    assert (again.verdict, again.why, again.timed_out, again.settled) == (Verdict.RERUN, "crashed", False, False)
    spent = decide(Crashed(), 0.0, 2, RULE)
    assert (spent.verdict, spent.why) == (Verdict.SPENT, "crashed, and was run 2 times again")
    assert spent.settled


def test_a_child_running_past_its_timeout_is_cancelled_and_run_again_within_its_budget():
    late = decide(Running(), 61.0, 0, RULE)
    assert (late.verdict, late.why, late.timed_out) == (Verdict.RERUN, "ran past its timeout of 60 s: cancelled", True)
    spent = decide(Running(), 61.0, 2, RULE)
    assert (spent.verdict, spent.timed_out) == (Verdict.SPENT, True)
    assert spent.why == "ran past its timeout of 60 s: cancelled, and was run 2 times again"
    assert decide(Running(), 10_000.0, 0, RerunRule()).verdict is Verdict.RUNNING, "no timeout: it runs on"


def test_a_failed_or_cancelled_child_is_ended_and_never_run_again():
    failed = decide(Failed(message="retries spent"), 0.0, 0, RULE)
    assert (failed.verdict, failed.why, failed.settled) == (Verdict.FAILED, "ended Failed", True)
    cancelled = decide(Cancelled(), 0.0, 0, RULE)
    assert (cancelled.verdict, cancelled.why, cancelled.settled) == (Verdict.CANCELLED, "ended Cancelled", True)


def test_a_gang_s_node_has_no_budget_a_crash_spends_it_at_once():
    spent = decide(Crashed(), 0.0, 0, RerunRule(max_reruns=0))
    assert (spent.verdict, spent.why) == (Verdict.SPENT, "crashed (a run here is not run again)")


def test_a_rule_that_cannot_hold_is_refused():
    assert RerunRule().max_reruns == MAX_RERUNS and RerunRule().timeout_s is None
    with pytest.raises(ValueError, match="max_reruns -1: must be 0 or more"):
        RerunRule(max_reruns=-1)
    with pytest.raises(ValueError, match="timeout_s 0: must be more than 0"):
        RerunRule(timeout_s=0)
