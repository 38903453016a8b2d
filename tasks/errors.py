"""Typed errors raised by the pipeline stages.

Problems with what a user gave us (labels, class sets, model directories) derive
from ``PipelineInputError``: they are deterministic, so the Prefect tasks' retry
condition (``tasks.retrying.retry_unless_input_error``) never retries them.

A run that started and then failed (a training, a shard, a sweep, the storage) raises a ``RunFailedError``
(mixed in beside its other base, which decides the retry): the command lines tell it in one line naming the
flow run and its log, exit status 1 (flows/cli.py).
"""

from __future__ import annotations


class PipelineInputError(ValueError):
    """Something the user gave us is not usable; retrying cannot help."""


class RunFailedError(Exception):
    """A run failed at runtime, past what its retries and re-runs could mend; its message's first line says what
    failed. Always mixed in with the error's own base (RuntimeError, or PipelineInputError when retrying cannot
    help)."""


class NotLabeledDatasetError(PipelineInputError):
    """Training (or validation) data has no labels."""


class InvalidDatasetError(PipelineInputError):
    """A data set cannot be used as given (class sets differ, too few classes, no images...)."""


class ClassTooSmallToSplitError(InvalidDatasetError):
    """A class has fewer than two distinct images: splitting cannot put one on each side."""


class InvalidModelDirectoryError(PipelineInputError):
    """A directory does not hold a usable model specification or trained model."""


class PretrainedWeightsError(InvalidModelDirectoryError):
    """Pretrained weights that cannot be used: a file whose sha256 is not the expected one (never loaded, never
    cached), a URL or S3 location with no expected hash, a staged file that differs from the recorded one."""


class PretrainedWeightsUnavailableError(PretrainedWeightsError):
    """Pretrained weights are in no cache here and no source could be reached (an offline or air-gapped host): the
    message names the three ways to provide the file."""


class WarmStartMismatchError(PipelineInputError):
    """A warm start from a registered version that does not fit the run: another architecture, or other classes
    than the training data's (the head keeps one output per class, in order)."""


class InvalidModelNameError(PipelineInputError):
    """A registry model name or reference is malformed."""


class ModelNotFoundError(PipelineInputError):
    """A registry reference names a model, version or alias that does not exist."""


class InvalidStorageURIError(PipelineInputError):
    """A storage location that is not a usable ``s3://bucket/prefix``."""


class OutputStorageError(RunFailedError, PipelineInputError):
    """The output cannot be written: a full disk (ENOSPC), a quota (EDQUOT), a read-only filesystem (EROFS), an I/O
    error (EIO) or no permission (EACCES, EPERM) there. A fault of the storage, never of the images: the
    message names the location, the free space and the space still needed; a retry cannot help until it is
    fixed, so none is made."""


class InvalidTrainingSetupError(PipelineInputError):
    """The training parameters ask for what this host cannot give (e.g. more CUDA processes than GPUs)."""


class NodesNotJoinedError(InvalidTrainingSetupError):
    """Not every node of a multi-node training started within ``join_timeout_s``: the work pool lacks free workers
    (or node 0 never published its rendezvous endpoint). Every node run was cancelled; retrying at once cannot help."""


class PrefectServerUnavailableError(PipelineInputError):
    """PREFECT_API_URL names a Prefect server that does not answer, asks for credentials that were not given, or
    is not a Prefect API: found before any work, with what to do about it."""


class TemporaryServerError(PrefectServerUnavailableError):
    """The temporary Prefect server a command starts (no PREFECT_API_URL) cannot start: its database cannot be
    made or reached, or its process exited, or it did not answer in time (flows/temporary_server.py)."""


class RerunLimitError(RunFailedError, PipelineInputError):
    """A training whose runs crashed (hosts lost) was already run again as often as allowed (tasks/launch/lost_runs.py)."""


class UnknownRunError(PipelineInputError):
    """A flow run id (``replaces_run``) that the Prefect server does not know."""


class OnnxMismatchError(PipelineInputError):
    """The exported ONNX model does not reproduce PyTorch's outputs: exporting again cannot help."""


class TrainingFailedError(RunFailedError, RuntimeError):
    """The torchrun worker exited with a non-zero status.

    ``rank`` is the first rank whose log recorded a failure (``None`` if no rank did),
    ``log_tail`` the last lines of that rank's log (or of the launcher output); ``returncode`` is ``None`` when
    torchrun had not exited (stopped by the watch) or ran elsewhere (a node of a multi-node training).
    """

    def __init__(self, message: str, *, returncode: int | None, rank: int | None, log_tail: str) -> None:
        super().__init__(f"{message}\n--- log tail (rank {rank if rank is not None else '?'}) ---\n{log_tail}")
        self.returncode = returncode
        self.rank = rank
        self.log_tail = log_tail


class TrainingHungError(TrainingFailedError):
    """A training process stopped answering (no heartbeat) or no process made progress; every process was stopped."""


class TrainingTimeoutError(TrainingFailedError):
    """Training ran past ``timeout_minutes``; every process was stopped (a retry resumes from the checkpoint)."""


class TrainingNodeFailedError(TrainingFailedError):
    """A node of a multi-node training ended without completing (failed, crashed, cancelled); the others were cancelled."""


class OutputInUseError(RunFailedError, RuntimeError):
    """Training processes of an earlier attempt still hold the output folder; a new attempt would write beside them."""


class TrainingDivergedError(TrainingFailedError, PipelineInputError):
    """The loss became NaN or infinite: the same parameters would diverge again, so it is not retried."""


class SweepFailedError(RunFailedError, PipelineInputError):
    """No trial of a sweep completed (each failed or was pruned): the search space's choices are the likely
    cause, so it is one line, not retried."""


class FailedImagesError(PipelineInputError):
    """A sharded scoring could not read or decode more images than ``max_failed_images`` allows: the images are
    the cause, so it is one line naming them, not retried."""


class ShardFailedError(RunFailedError, RuntimeError):
    """A shard of a sharded scoring failed (its own retries spent) or was run again as often as allowed: the
    message names the shard, its index rows, its last flow run and that run's last message."""


class UnreadableImageError(PipelineInputError):
    """An image that cannot be decoded, the same wherever it is (predict, scoring, the endpoint, training): missing,
    empty, not an image Pillow reads, damaged or truncated, or more pixels than allowed (refused from its header, so
    a decompression bomb is never decoded). ``part`` names the image as its caller did; ``status`` is the HTTP status
    the endpoint answers it with (400, or 413 for too many pixels)."""

    def __init__(self, part: str, reason: str = "", status: int = 400) -> None:
        super().__init__(f"{part}: {reason}" if reason else part)  # one argument: a whole message, told again
        self.part, self.reason, self.status = part, reason, status

    def __reduce__(self):  # across a process boundary with its three arguments, not its message
        return type(self), (self.part, self.reason, self.status)


class InvalidTransformationsError(PipelineInputError):
    """The image transformations cannot run at the training size (e.g. a random crop larger than the padded image)."""


# --- the registry's ---------------------------------------------------------------------------
class CorruptRegistryRecordError(PipelineInputError):
    """A record read from a registry (registration.json, an alias file) is unreadable or names something
    it may not (a file outside the allowed set, another model or version). Reading it again cannot help."""


class ModelIntegrityError(PipelineInputError):
    """A stored model file does not match the sha256 recorded when its version was registered."""


class AliasedVersionError(PipelineInputError):
    """A version an alias points at cannot be deleted: move or unset the alias first."""


class InvalidQueryError(PipelineInputError):
    """A search condition or a tag is malformed."""


# --- the monitoring stage's ------------------------------------------------------------------
class LabelConflictError(InvalidDatasetError):
    """A labelled batch holds one image (the same sha256) under two classes: which one is right only a person knows."""
