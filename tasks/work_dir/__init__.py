"""A run's work dir across hosts, where it needs the contracts (tasks/storage/work_dir_on_s3.py has the rest, the
locations and this host's cache): ``images`` (an ImageDirectory stored on S3 once and fetched into a host's cache,
checked against its manifest), ``training_output`` (a training's output kept in step with its S3 folder; a
training's folders staged on this host) and ``prefect_tasks`` (the ``store`` task). Nothing is imported here:
importing the package imports neither torch nor Prefect."""
