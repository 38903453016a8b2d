"""The fan-out engine's one rule for a child flow run, as a pure function of what one look at it found: its state,
how long it has been running, and how often it was run again already.

- Completed: done; its caller reads what it wrote.
- Crashed (its host or worker lost: the lost-host automation or the worker set it so), or Running past the
  fan-out's ``timeout_s``: run again by the engine, through the fan-out's own queue, with ``replaces_run`` naming
  it, at most ``max_reruns`` times; after that its budget is spent. A timed-out run is cancelled first.
- Failed (its own retries spent) or Cancelled (by someone else): ended; its caller says what that means for the
  fan-out (a shard fails the scoring, a trial is told failed), or its completion rule does (a node fails a
  fixed-size gang).
- Anything else (Scheduled, Pending, Running within its time, Paused, Cancelling): waiting or running.

And the rule for the whole fan-out (its completion rule, handed to the engine): by default done once every child
is settled (``every_child_settled``); a gang's is its own (``Outcome``: done, or children to end as lost).

Nothing here reads the server, so every decision has a unit test (tests/fanout/test_decisions.py). The
automation "Run a training again when its run crashed (host lost)" (deployments/automations.py) re-runs only
crashed runs of train-pipeline deployments, which are never a fan-out's children: no run is re-run by both.
"""

from __future__ import annotations

import dataclasses
import enum

from pydantic import BaseModel

MAX_RERUNS = 2  # a training, trial or shard is run at most 1 + MAX_RERUNS times when its hosts keep being lost


class LostRun(BaseModel):
    """A run that a re-run replaces (its chain: tasks/fanout/reruns.py)."""

    id: str
    name: str
    state: str  # the state's name and message: "Crashed: No heartbeat for 180 s: ..."


class Verdict(enum.Enum):
    WAITING = "waiting"  # not running yet (Scheduled, Pending, Paused) or being cancelled
    RUNNING = "running"
    COMPLETED = "completed"
    RERUN = "rerun"  # crashed or past its timeout, re-runs left: the engine runs it again
    SPENT = "spent"  # crashed or past its timeout with its re-runs spent
    FAILED = "failed"  # ended Failed: its own retries spent
    CANCELLED = "cancelled"  # ended Cancelled, not by its fan-out


@dataclasses.dataclass(frozen=True)
class RerunRule:
    """How often a child is run again when it crashed or ran past ``timeout_s`` (None: no timeout)."""

    max_reruns: int = MAX_RERUNS
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_reruns < 0:
            raise ValueError(f"max_reruns {self.max_reruns}: must be 0 or more")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s {self.timeout_s}: must be more than 0 (or None: no timeout)")


@dataclasses.dataclass(frozen=True)
class Decision:
    verdict: Verdict
    why: str = ""  # what happened to the run: "crashed", "ran past its timeout of 60 s", "ended Failed"
    timed_out: bool = False  # the run is still running and must be cancelled before anything else

    @property
    def settled(self) -> bool:
        """The child will not run again: the engine settles it (no longer looked at, nor cancelled on the way out)."""
        return self.verdict in (Verdict.COMPLETED, Verdict.SPENT, Verdict.FAILED, Verdict.CANCELLED)


def decide(state, running_for: float, reruns: int, rule: RerunRule) -> Decision:
    """The engine's decision for a child whose run is in ``state`` (a Prefect State, or None before the server
    gave it one), running for ``running_for`` seconds (0 unless Running), run again ``reruns`` times so far."""
    if state is None:
        return Decision(Verdict.WAITING)
    if state.is_completed():
        return Decision(Verdict.COMPLETED)
    why, timed_out = None, False
    if state.is_crashed():
        why = "crashed"
    elif state.is_running() and rule.timeout_s is not None and running_for > rule.timeout_s:
        why, timed_out = f"ran past its timeout of {rule.timeout_s:g} s: cancelled", True
    elif state.is_failed():
        return Decision(Verdict.FAILED, "ended Failed")
    elif state.is_cancelled():
        return Decision(Verdict.CANCELLED, "ended Cancelled")
    if why is None:
        return Decision(Verdict.RUNNING if state.is_running() else Verdict.WAITING)
    if reruns >= rule.max_reruns:
        times = f"{reruns} time{'' if reruns == 1 else 's'}"
        spent = f"{why}, and was run {times} again" if reruns else f"{why} (a run here is not run again)"
        return Decision(Verdict.SPENT, spent, timed_out)
    return Decision(Verdict.RERUN, why, timed_out)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a fan-out's completion rule says after a look: whether the fan-out is done, and which children to end
    Crashed first (key → the message), their host lost with their worker, which no one else is left to end."""

    done: bool
    lost: dict[int, str] = dataclasses.field(default_factory=dict)


def every_child_settled(fan) -> Outcome:
    """The default completion rule: done once no child is left to watch (``fan.unsettled``, children the caller
    submitted on the last look included). A caller whose children's ends decide more (a gang: tasks/launch/
    multinode.py's ``GangRule``) hands the engine its own rule; a rule raises to fail the fan-out."""
    return Outcome(done=not fan.unsettled)
