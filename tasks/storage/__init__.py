"""Where files live: ``s3`` (S3 URIs, reads and writes through boto3, retried), ``local_files`` (atomic writes,
free space, storage faults told apart), ``work_dir_on_s3`` (a run folder's locations on S3 and their copies in
this host's cache; what needs a contract is tasks/work_dir/), ``runs`` (what a registered run keeps; run folders
listed and pruned) and ``prefect_tasks`` (the task ``keep_results``; the only module here that imports Prefect).
Nothing is imported here: the worker and the contracts import the leaves they need without Prefect."""
