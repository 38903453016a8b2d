"""A trained model labelling a few photos at once, no Prefect: ``classifier`` (``Classifier``: a model folder or
registry reference in memory, scoring's decode and transforms, nothing written). Nothing is imported here:
importing the package imports no torch."""
