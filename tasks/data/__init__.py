"""The data before training: ``datasets`` (the bundled digits exported as class folders), ``split`` (one
ImageDirectory into two, near-duplicates on one side), ``validate`` (label checks and leakage between the sets)
and ``preflight`` (what can be checked before any work). Nothing is imported here: importing the package imports
neither torch nor Prefect."""
