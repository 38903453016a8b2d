"""The Prefect side of a sweep that is not the trials' runs (trials.py): each trial's training built from the
study's parameters through the model stage's and the work dir's tasks (``TrialBuilder``, called by ``run_trials``
for each trial the study asks for), and the study stored after every change (``publish_study``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.model.prefect_tasks import resolve_pretrained_weights, untrained_model_directory
from tasks.storage.work_dir_on_s3 import join, local_folder
from tasks.sweep.run_folder import stored_study, trial_model
from tasks.sweep.space import SearchSpace, apply_params
from tasks.sweep.study import SweepStudy, TrialRecord, trial_folder
from tasks.sweep.trials import publish_table
from tasks.work_dir.prefect_tasks import store


@dataclass(frozen=True)
class TrialBuilder:
    """A trial's folders and training parameters: the base ``spec`` and ``training`` with the trial's parameters
    applied, its untrained model (checked pretrained weights staged) stored in its folder of ``run_dir``, and the
    sweep's data (converted once, stored at ``train_dir`` and ``validation_dir``) shared by every trial."""

    search_space: SearchSpace
    spec: ModelSpec
    training: TrainingParams
    run_dir: str
    train_dir: str
    validation_dir: str

    def __call__(self, trial: TrialRecord) -> tuple[TrainingFolders, TrainingParams]:
        trial_spec, params = apply_params(self.search_space, trial.params, self.spec, self.training)
        resolve_pretrained_weights(trial_spec)
        folder = trial_folder(trial.number)
        spec_dir = untrained_model_directory(str(local_folder(self.run_dir) / folder / "model_spec"), trial_spec)
        folders = TrainingFolders(
            train_dir=self.train_dir,
            validation_dir=self.validation_dir,
            model_spec_dir=store(spec_dir, join(self.run_dir, folder, "model_spec")),
            output_dir=trial_model(self.run_dir, trial.number),
        )
        return folders, params


def publish_study(study: SweepStudy, study_dir: Path, run_dir: str) -> None:
    """On S3: the study beside the run's other files, after every change; and the ``sweep`` artifact's table."""
    store(str(study_dir), stored_study(run_dir))
    publish_table(study)
