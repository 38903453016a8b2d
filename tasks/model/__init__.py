"""The model a training starts from (Azure's DenseNet / ResNet model modules):

    untrained.py      ModelSpec → UntrainedModelDirectory: ``with_pretrained_default`` and
                      ``write_untrained_model_directory`` (the pretrained weights resolved, checked against the
                      architecture and staged beside the spec)
    prefect_tasks.py  the tasks ``resolve_pretrained_weights`` (artifact ``pretrained-weights``) and
                      ``untrained_model_directory`` (artifact ``model-spec``)

Nothing is imported here: importing the package imports neither torch nor Prefect.
"""
