"""A sweep's run folder (tasks/sweep/run_folder.py) on a local path: where the study and each trial's model are,
and the best trial's model made ready to register with the sweep's pictures beside its files."""

from tasks.sweep.run_folder import best_model_with_pictures, local_study, study_stored, trial_model
from tasks.sweep.study import STUDY_FILE


def test_a_local_run_folder_holds_its_study_and_trials_in_place(tmp_path):
    run_dir = str(tmp_path / "sweep-1")
    assert not study_stored(run_dir)
    study = local_study(run_dir)
    assert study == tmp_path / "sweep-1" / "sweep"
    study.mkdir(parents=True)
    (study / STUDY_FILE).write_text("{}")
    assert study_stored(run_dir)
    assert trial_model(run_dir, 7) == str(tmp_path / "sweep-1" / "trials" / "trial-007" / "model")


def test_the_best_model_gets_the_sweeps_pictures_beside_its_files(tmp_path):
    run_dir = str(tmp_path / "sweep-1")
    model = tmp_path / "sweep-1" / "trials" / "trial-002" / "model"
    model.mkdir(parents=True)
    picture = tmp_path / "importance.png"
    picture.write_bytes(b"png")
    assert best_model_with_pictures(run_dir, 2, [picture]) == str(model)
    assert (model / "sweep_importance.png").read_bytes() == b"png"
