"""Hyperparameter sweep: the data converted, split and validated once, then ``trials`` trainings over the ``gpu``
pool, ``parallel`` at a time, sampled and pruned by Optuna (tasks/sweep), and the best trial's model scored,
evaluated and registered like train_pipeline's.

    image-classifier sweep --train-data photos --validation-fraction 0.2 --trials 16 --parallel 2 \\
        --search-space '{"learning_rate": {"kind": "log_uniform", "low": 0.001, "high": 0.1}}'

Each trial is a run of the ``sweep-trial`` deployment (make deploy; a worker per GPU host: make worker). The
study is a journal file in the sweep's run folder: a retried sweep keeps its finished trials and re-attaches to
the running ones.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from prefect import flow
from prefect.runtime import flow_run
from prefect.states import Completed

from flows import run_folder
from flows.cli import checks
from flows.pipeline import PipelineResult, check_inputs, evaluate_and_register, prepare_data
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.errors import PipelineInputError, SweepFailedError
from tasks.fanout.reruns import take_over_stopped_run
from tasks.model.untrained import with_pretrained_default
from tasks.near_duplicates import DEFAULT_DISTANCE
from tasks.registry import PromotionPolicy
from tasks.storage.runs import Keep
from tasks.storage.s3 import is_s3_uri
from tasks.storage.work_dir_on_s3 import join, local_folder
from tasks.sweep import SearchSpace, SweepSettings, SweepStudy, apply_params
from tasks.sweep.run_folder import best_model_with_pictures, local_study, stored_study, study_stored, trial_model
from tasks.sweep.space import check_search_space, describe_search
from tasks.sweep.study import STUDY_FILE
from tasks.work_dir.prefect_tasks import store


@flow(name="sweep-pipeline", log_prints=True)
def sweep_pipeline(
    train_data: str | None = None,
    validation_data: str | None = None,
    validation_fraction: float | None = None,
    near_duplicate_distance: int = DEFAULT_DISTANCE,
    model: ModelSpec = ModelSpec(),
    training: TrainingParams = TrainingParams(),
    search_space: SearchSpace = SearchSpace(),
    sweep: SweepSettings = SweepSettings(),
    conversion: ConversionLimits = ConversionLimits(),
    model_name: str | None = None,
    registry: str = "registry",
    work_dir: str = "runs",
    promotion: PromotionPolicy = PromotionPolicy(),
    keep: Keep = "results",
    resume: str | None = None,
) -> PipelineResult:
    """Sweep hyperparameters: train many models over the gpu pool, pruning poor ones early, and register the best.

    Args:
        train_data: Class-per-folder folder or .zip of training images; empty: the bundled digits.
        validation_data: Validation images with the same classes; empty: split off train_data by validation_fraction.
        validation_fraction: Share of each class's images split off train_data for validation (e.g. 0.2).
        near_duplicate_distance: Images whose 64-bit perceptual hashes differ in at most this many bits stay on one side of the split; -1: identical files only.
        model: The base ModelSpec; the search space varies its architecture and transformations.
        training: The base training parameters (epochs: the most a trial trains); the search space varies some.
        search_space: What the sweep varies: per field a range (log_uniform, uniform, int) or a choice. Only the fields it names are varied; every other keeps the base model's or training's value. Left out (or {}): learning_rate 0.0001..0.1 and weight_decay 1e-06..0.01, both log-uniform
        sweep: Trials in all, how many train at once, the sampler (random or TPE) and its seed, the pruner (none, median, ASHA) and the figure trials are judged by.
        conversion: Limits on what converting the images may unpack and decode.
        model_name: Registry name; empty: the training data's name, a dash and the architecture.
        registry: Registry folder or s3://bucket/prefix.
        work_dir: Folder or s3://bucket/prefix for the sweep's run folder (data, study, each trial's model).
        promotion: Whether the best trial's version takes an alias (as train_pipeline's promotion).
        keep: What the run folder keeps once the best version is registered: results (every trial's figures, curves and logs; the model files, checkpoints and staged pretrained weights go, the registry holds the best), or all.
        resume: The run folder of a sweep that stopped part way (its process killed, its host lost): its finished trials are kept, its running ones watched again, and only the trials still missing are trained.
    """
    check_sweep_inputs(  # before any work
        train_data=train_data,
        validation_data=validation_data,
        validation_fraction=validation_fraction,
        near_duplicate_distance=near_duplicate_distance,
        model=model,
        training=training,
        search_space=search_space,
        model_name=model_name,
        registry=registry,
        promotion=promotion,
        resume=resume,
    )
    spec = with_pretrained_default(model, own_data=bool(train_data or validation_data))
    # A retried sweep finds its study and trials again (the folder is named after the flow run); a new run can
    # take over a stopped one's.
    if resume is not None:
        run_dir = resume if is_s3_uri(resume) else str(Path(resume).resolve())
    else:
        run_dir = run_folder(work_dir, prefix="sweep-")
    print(f"sweep run folder {run_dir} (after a stop, --resume {run_dir} goes on from it)")
    print(describe_search(search_space, spec, training))
    train_dir, validation_dir = prepare_data(
        train_data,
        validation_data,
        validation_fraction,
        near_duplicate_distance,
        conversion,
        work_dir,
        local_folder(run_dir),
        training.random_seed,
    )
    stored_train = store(train_dir, join(run_dir, "data", "train"))
    stored_validation = store(validation_dir, join(run_dir, "data", "validation"))
    study_dir = local_study(run_dir)
    study = SweepStudy(study_dir, sweep, search_space)
    if (stopped := study.begin_attempt(flow_run.get_id())) is not None:
        take_over_stopped_run(stopped, "sweep")  # the stopped attempt's run set Crashed, the two linked

    from tasks.sweep.prefect_tasks import TrialBuilder, publish_pictures, publish_study, run_trials

    # The sweep's own work queue, named after its run folder: a resumed or retried sweep finds the same one.
    run_trials(
        study,
        TrialBuilder(search_space, spec, training, run_dir, stored_train, stored_validation),
        queue=PurePosixPath(run_dir.rstrip("/")).name,
        on_change=lambda: publish_study(study, study_dir, run_dir),
    )
    best = study.best()
    if best is None:
        ended = ", ".join(f"trial {r.number} {r.state}" for r in study.records())
        raise SweepFailedError(
            f"no trial of the sweep completed ({ended}): each trial's flow run (the sweep artifact lists them) says "
            "why; narrow the search space (a learning rate too high diverges) or give the trials more epochs"
        )
    importances = study.importances()
    pictures = publish_pictures(study, study_dir, importances)
    store(str(study_dir), stored_study(run_dir))
    best_spec, best_training = apply_params(search_space, best.params, spec, training)
    model_dir = best_model_with_pictures(run_dir, best.number, pictures)
    registered, evaluation, size = evaluate_and_register(
        model_dir,
        train_dir,
        validation_dir,
        run_dir,
        registry=registry,
        model_name=model_name,
        params={
            "model": best_spec.model_dump(),
            "training": best_training.model_dump(),
            "sweep": {
                "settings": sweep.model_dump(),
                "search_space": search_space.model_dump(mode="json"),
                "best_trial": best.number,
                "importance": importances,
                "trials": [r.model_dump() for r in study.records()],
            },
        },
        promotion=promotion,
        keep=keep,
        unregistered=[trial_model(run_dir, r.number) for r in study.records() if r.number != best.number],
    )
    result = PipelineResult.of(registered, evaluation, run_dir, size, keep)
    return Completed(message=f"best of {sweep.trials} trials: trial {best.number}; {result.headline()}", data=result)


@checks(sweep_pipeline)
def check_sweep_inputs(
    *,
    train_data: str | None,
    validation_data: str | None,
    validation_fraction: float | None,
    near_duplicate_distance: int,
    model: ModelSpec,
    training: TrainingParams,
    search_space: SearchSpace,
    model_name: str | None,
    registry: str,
    promotion: PromotionPolicy,
    resume: str | None,
) -> None:
    """train_pipeline's checks, the search space's (one line naming the field), and a sweep to resume."""
    check_search_space(search_space)
    check_inputs(
        train_data=train_data,
        validation_data=validation_data,
        validation_fraction=validation_fraction,
        near_duplicate_distance=near_duplicate_distance,
        model=model,
        training=training,
        model_name=model_name,
        registry=registry,
        promotion=promotion,
    )
    if resume is not None and not study_stored(resume):
        raise PipelineInputError(
            f"resume {resume!r} is not a sweep's run folder: it holds no sweep/{STUDY_FILE}; give the folder a "
            "sweep printed when it started (under its work_dir, named sweep-…)"
        )


def main(argv: list[str] | None = None, prog: str = "python -m flows.sweep") -> int:
    """Command line: a flag per parameter and per field of ModelSpec, TrainingParams, SweepSettings and
    ConversionLimits; ``--search-space`` takes the space as JSON."""
    from flows import cli

    result = cli.run_flow(
        sweep_pipeline,
        argv,
        prog=prog,
        check=check_sweep_inputs,
        log_name="sweep",
        skip_fields={"model": ("weights", "started_from")},
        whole=("search_space",),
    )
    print(result.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
