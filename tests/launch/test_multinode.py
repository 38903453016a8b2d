"""tasks/launch/multinode.py's constants agree with what is deployed."""

from deployments.local import PROJECT_ROOT


def test_the_node_deployment_the_train_stage_submits_is_the_one_deployments_prefect_yaml_defines():
    import importlib

    import yaml

    from tasks.launch.multinode import NODE_DEPLOYMENT

    deployments = yaml.safe_load((PROJECT_ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    defined = set()
    for deployment in deployments:
        module, function = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), function)
        defined.add(f"{flow.name}/{deployment['name']}")
    assert NODE_DEPLOYMENT in defined, defined
