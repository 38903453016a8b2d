"""The data before training: ``datasets`` (the bundled digits exported as class folders; the sources a run
trains on, given or those), ``split`` (one ImageDirectory into two, near-duplicates on one side), ``validate``
(label checks and leakage between the sets), ``preflight`` (what can be checked before any work) and
``prefect_tasks`` (the tasks ``resolve_sources``, ``split`` and ``validate_labels``; the only module here that
imports Prefect). Nothing is imported here: importing the package imports neither torch nor Prefect."""
