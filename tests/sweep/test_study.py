"""The sweep's Optuna study in its journal file: exactly ``trials`` trials, seeded sampling, pruning by the
median and by successive halving, and a sweep opened again that keeps its finished trials, re-queues an
abandoned one with the same parameters, never counts a trial twice and draws new parameters, not its first ones
again."""

import pytest

from tasks.errors import PipelineInputError
from tasks.sweep import SearchSpace, SweepSettings, SweepStudy
from tasks.sweep.space import DEFAULT_SPACE, IntRange
from tasks.sweep.study import STUDY_FILE


def study(folder, **settings) -> SweepStudy:
    space = SearchSpace(**DEFAULT_SPACE, batch_size=IntRange(low=8, high=64, step=8))
    return SweepStudy(folder, SweepSettings(**settings), space)


def test_ask_stops_at_trials_and_the_best_is_the_highest_figure(tmp_path):
    sweep = study(tmp_path, trials=3, parallel=1, sampler="random", pruner="none")
    for figure in (0.5, 0.9, 0.7):
        trial = sweep.ask()
        assert trial.state == "running" and set(trial.params) == {"learning_rate", "weight_decay", "batch_size"}
        sweep.tell(trial.number, "complete", figure)
    assert sweep.ask() is None
    assert sweep.best().value == 0.9 and [r.state for r in sweep.records()] == ["complete"] * 3
    assert (tmp_path / STUDY_FILE).is_file()


def test_the_same_seed_samples_the_same_trials(tmp_path):
    for sampler in ("random", "tpe"):
        first = [study(tmp_path / f"{sampler}-a", sampler=sampler).ask().params for _ in range(1)]
        again = [study(tmp_path / f"{sampler}-b", sampler=sampler).ask().params for _ in range(1)]
        other = [study(tmp_path / f"{sampler}-c", sampler=sampler, seed=2).ask().params for _ in range(1)]
        assert first == again and first != other


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_reopened_sweep_samples_new_parameters_the_same_way_each_time(tmp_path, sampler):
    """A sweep's process killed after two trials and the sweep opened again: its third trial is not its first
    again (the seed's stream restarted would draw it), and the same sweep resumed elsewhere draws the same one."""
    thirds = []
    for folder in ("a", "b"):
        sweep = study(tmp_path / folder, sampler=sampler, trials=4)
        first = [sweep.ask().params for _ in range(2)]
        thirds.append(study(tmp_path / folder, sampler=sampler, trials=4).ask().params)
        assert thirds[-1] not in first
    assert thirds[0] == thirds[1]


def test_a_reopened_sweep_keeps_its_trials_and_reruns_an_abandoned_one_without_counting_it(tmp_path):
    sweep = study(tmp_path, trials=3, parallel=2, pruner="none")
    done, lost = sweep.ask(), sweep.ask()
    sweep.attach(lost.number, "flow-run-of-the-lost-trial")
    sweep.report(lost.number, 1, 0.4)
    sweep.tell(done.number, "complete", 0.8)

    reopened = study(tmp_path, trials=3, parallel=2, pruner="none")  # the sweep's process was killed
    (running,) = reopened.running()
    assert running.number == lost.number and running.flow_run_id == "flow-run-of-the-lost-trial"
    assert running.epochs == 1
    reopened.abandon(lost.number)
    rerun = reopened.ask()
    assert rerun.params == lost.params and rerun.number not in (done.number, lost.number)
    reopened.tell(rerun.number, "complete", 0.6)
    last = reopened.ask()
    reopened.tell(last.number, "complete", 0.7)
    assert reopened.ask() is None
    states = [r.state for r in reopened.records()]
    assert states.count("complete") == 3 and states.count("abandoned") == 1 and reopened.counted() == 3


@pytest.mark.parametrize("pruner", ["median", "asha"])
def test_a_poor_trial_is_pruned_while_good_ones_go_on(tmp_path, pruner):
    sweep = study(tmp_path, trials=6, parallel=2, pruner=pruner, sampler="random")
    for _ in range(4):  # four trials that learn
        trial = sweep.ask()
        for epoch in range(1, 7):
            assert not sweep.report(trial.number, epoch, 0.5 + 0.08 * epoch)
        sweep.tell(trial.number, "complete", 0.98)
    poor = sweep.ask()
    pruned_at = next(epoch for epoch in range(1, 7) if sweep.report(poor.number, epoch, 0.1))
    sweep.tell(poor.number, "pruned")
    assert pruned_at <= 2 and sweep.record(poor.number).state == "pruned"


@pytest.mark.parametrize("pruner", ["median", "asha"])
def test_no_trial_is_pruned_before_prune_after_epochs(tmp_path, pruner):
    sweep = study(tmp_path, trials=6, parallel=2, pruner=pruner, sampler="random", prune_after=3)
    for _ in range(4):
        trial = sweep.ask()
        for epoch in range(1, 7):
            sweep.report(trial.number, epoch, 0.5 + 0.08 * epoch)
        sweep.tell(trial.number, "complete", 0.98)
    poor = sweep.ask()
    pruned_at = next(epoch for epoch in range(1, 7) if sweep.report(poor.number, epoch, 0.1))
    assert pruned_at == 3


def test_settings_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="parallel 5 is more than trials 4"):
        SweepSettings(trials=4, parallel=5)
    with pytest.raises(ValueError, match="Input should be 'top1', 'top5' or 'val_loss'"):
        SweepSettings(metric="f1")
    with pytest.raises(ValueError, match="prune_after\n  Input should be greater than or equal to 1"):
        SweepSettings(prune_after=0)
    assert SweepSettings(metric="val_loss").objective == "minimize"
    assert issubclass(PipelineInputError, ValueError)


def test_importances_and_pictures_of_the_completed_trials(tmp_path):
    sweep = study(tmp_path / "study", trials=5, parallel=1, sampler="random", pruner="none")
    assert sweep.importances() == {} and sweep.pictures(tmp_path / "none") == []
    for _ in range(5):
        trial = sweep.ask()
        sweep.report(trial.number, 1, 0.5)
        sweep.tell(trial.number, "complete", trial.params["batch_size"] / 64)
    assert set(sweep.importances()) == {"learning_rate", "weight_decay", "batch_size"}
    pictures = sweep.pictures(tmp_path / "pictures")
    assert [p.name for p in pictures] == ["optimisation_history.png", "parallel_coordinate.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pictures)


def test_a_reopened_study_names_the_run_that_drove_it_before_and_a_retry_is_not_a_new_attempt(tmp_path):
    first = study(tmp_path, trials=2, parallel=1)
    assert first.begin_attempt("run-a") is None, "a new study"
    assert first.begin_attempt("run-a") is None, "the same run again: a retry of the flow"
    reopened = study(tmp_path, trials=2, parallel=1)
    assert reopened.begin_attempt("run-b") == "run-a"
    assert study(tmp_path, trials=2, parallel=1).begin_attempt("run-c") == "run-b"
