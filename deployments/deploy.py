"""`make deploy`: `prefect deploy` of deployments/prefect.yaml that leaves each schedule switched on or off as it is.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.deploy

First it creates the work pools the file names (process pools) that the server does not have yet. `prefect
deploy` replaces a deployment's schedules with the file's, so every re-deploy would pause again a
schedule someone switched on in the UI (the file ships it paused). This reads each schedule's state from the
server first (a schedule is known by its cron and time zone: a slug would do, but the UI then shows the slug
instead of "At 03:00 AM, only on Monday") and deploys a copy of the file that carries it; a schedule the
server does not have yet starts as the file says. Then it creates or updates the automations
(deployments/automations.py): a run whose heartbeats stop is set Crashed, a crashed training run is run again, a
drift event (the monitor deployment's) runs the training deployment, and so does a labelled batch announced (with
the batch), each at most once every --retrain-every-h hours.
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments.automations import (
    LABELLED_AUTOMATION,
    MISSED_HEARTBEATS,
    RERUN_AUTOMATION,
    RETRAIN_AUTOMATION,
    RETRAIN_INTERVAL,
    ZOMBIE_AUTOMATION,
    ensure_labelled_automation,
    ensure_rerun_automation,
    ensure_retrain_automation,
    ensure_zombie_automation,
    heartbeat_seconds,
)
from deployments.local import PROJECT_ROOT
from tasks.fanout.decisions import MAX_RERUNS
from tasks.launch.multinode import NODE_DEPLOYMENT
from tasks.outages import RIDE_OUT_SERVER_RESTART, heartbeat_tag
from tasks.score_shards.parts import SHARD_DEPLOYMENTS
from tasks.sweep.study import TRIAL_DEPLOYMENT

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"


def schedule_key(cron: str, timezone: str | None) -> str:
    return f"{cron} {timezone or 'UTC'}"


def read_schedule_states(names: list[str]) -> dict[str, dict[str, bool]]:
    """``{"flow/deployment": {schedule key: active}}`` for those of ``names`` the server (PREFECT_API_URL) has."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    states = {}
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                deployment = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            states[name] = {
                schedule_key(s.schedule.cron, s.schedule.timezone): s.active
                for s in deployment.schedules
                if hasattr(s.schedule, "cron")
            }
    return states


def keep_schedule_states(schedules: list[dict], states: dict[str, bool]) -> list[dict]:
    """The file's (cron) schedules, each ``active`` as the server has it where the server has it."""
    kept = []
    for schedule in schedules:
        key = schedule_key(schedule["cron"], schedule.get("timezone"))
        kept.append({**schedule, "active": states[key]} if key in states else schedule)
    return kept


# The deployments whose crashed runs are run again: the training pipeline's (it takes replaces_run).
RERUN_ENTRYPOINT = "flows/pipeline.py:train_pipeline"


def run_job_variables(job_variables: dict) -> dict:
    """A deployment's job variables with what every run of ours needs from its worker: its process started by
    deployments/engine.py (this interpreter, in the project root: the pull step's folder) so that a server restart
    around its start does not crash it, and the client settings that ride out a restart
    (tasks/outages) in its environment; what the file sets itself wins."""
    env = {**RIDE_OUT_SERVER_RESTART, **job_variables.get("env", {})}
    return {
        "command": shlex.join([sys.executable, "-m", "deployments.engine"]),
        "working_dir": str(PROJECT_ROOT),
        **job_variables,
        "env": env,
    }


def rerun_by_automation(config: dict) -> list[bool]:
    """For each deployment of ``config``, whether the automation runs its crashed runs again: the training
    pipeline's. A fan-out's children (node, trial, shard runs) are run again by their fan-out's engine
    (tasks/fanout/engine.py), never by the automation too."""
    return [entry["entrypoint"] == RERUN_ENTRYPOINT for entry in config["deployments"]]


def deployment_names(config: dict) -> list[str]:
    """``flow/deployment`` of each entry (the flow's name is the one its @flow gives, so the flow is loaded)."""
    entries = config["deployments"]
    return [f"{load_flow_from_entrypoint(str(PROJECT_ROOT / e['entrypoint'])).name}/{e['name']}" for e in entries]


def ensure_work_pools(pools: list[str]) -> list[str]:
    """Creates each of ``pools`` that the server lacks, as a process pool; returns those it created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    created = []
    with get_client(sync_client=True) as client:
        for pool in dict.fromkeys(pools):
            try:
                client.read_work_pool(pool)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
                created.append(pool)
    return created


def deploy(path: Path = DEPLOYMENT_FILE, retrain_every: timedelta = RETRAIN_INTERVAL) -> int:
    """Creates the file's missing work pools, runs ``prefect deploy --all`` on the kept copy of ``path``; returns
    its exit status."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    for pool in ensure_work_pools([entry["work_pool"]["name"] for entry in config["deployments"]]):
        print(f"Created work pool {pool!r} (type process).")
    names = deployment_names(config)
    states = read_schedule_states(names)
    kept = copy.deepcopy(config)
    beat = heartbeat_seconds(config)
    for entry, name in zip(kept["deployments"], names):
        entry["schedules"] = keep_schedule_states(entry.get("schedules", []), states.get(name, {}))
        entry["work_pool"]["job_variables"] = run_job_variables(entry["work_pool"].get("job_variables", {}))
        entry["tags"] = [*entry.get("tags", []), heartbeat_tag(beat)]  # the lost-host automation watches it
    with tempfile.TemporaryDirectory() as folder:
        deployment_file = Path(folder) / "prefect.yaml"
        deployment_file.write_text(yaml.safe_dump(kept, sort_keys=False), encoding="utf-8")
        # Entrypoints and the pull step's {{ $PWD }} are the project root's, wherever the file lies.
        command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", deployment_file]
        environment = {**os.environ, "PWD": str(PROJECT_ROOT)}
        result = subprocess.run(command, cwd=PROJECT_ROOT, env=environment, check=False, capture_output=True, text=True)
    if result.returncode != 0:  # Prefect's own account of what went wrong, whole
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode
    ids = deployment_ids(names)
    ensure_zombie_automation(heartbeat_tag(beat), timedelta(seconds=MISSED_HEARTBEATS * beat))
    training = [id for id, rerun in zip(ids, rerun_by_automation(config)) if rerun]
    ensure_rerun_automation(training)
    ensure_retrain_automation(training[0], retrain_every)
    ensure_labelled_automation(training[0], retrain_every)
    print(next_steps(config, names))
    print(
        f"Automation {ZOMBIE_AUTOMATION!r}: a run of these deployments beats every {beat} s and is set Crashed "
        f"after {MISSED_HEARTBEATS * beat} s without a heartbeat (its host, worker or process was lost).\n"
        f"Automation {RERUN_AUTOMATION!r}: a crashed training run is run again (at most {MAX_RERUNS} times), "
        "resuming from its checkpoint when its work_dir is on S3 or a shared folder.\n"
        f"Automation {RETRAIN_AUTOMATION!r}: a drift event runs {names[ids.index(training[0])]} at most once every "
        f"{retrain_every.total_seconds() / 3600:g} h.\n"
        f"Automation {LABELLED_AUTOMATION!r}: a labelled batch announced runs it with the batch, at most once every "
        f"{retrain_every.total_seconds() / 3600:g} h."
    )
    return 0


def deployment_ids(names: list[str]) -> list[str]:
    """The server's ids of the deployments ``names`` (``flow/deployment``)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return [str(client.read_deployment_by_name(name).id) for name in names]


def next_steps(config: dict, names: list[str]) -> str:
    """What ``make deploy`` tells a user once the deployments are on the server: what was deployed and what to
    do next. Prefect's own hints are left out: they suggest starting runs of ``train-node``, which only the
    train stage starts, and a worker command without the project's settings (``make worker`` has them)."""
    api_url = os.environ.get("PREFECT_API_URL", "")
    pools = [entry["work_pool"]["name"] for entry in config["deployments"]]
    submitted = (NODE_DEPLOYMENT, TRIAL_DEPLOYMENT, *SHARD_DEPLOYMENTS.values())
    by_hand = next(name for name in names if name not in submitted)
    lines = [f"Deployed {len(names)} deployments to {api_url or 'the Prefect API'}:"]
    lines += [f"  {name}  (work pool {pool})" for name, pool in zip(names, pools)]
    lines += [
        f"{NODE_DEPLOYMENT} runs are started by the train stage of a multi-node training, {TRIAL_DEPLOYMENT} "
        f"runs by a sweep, and {' and '.join(SHARD_DEPLOYMENTS.values())} runs by a sharded scoring, never by hand.",
        "Next:",
        f"  on each host that runs flows: make worker POOL=<{'|'.join(sorted(set(pools)))}>",
        f"  start a run: the Run button in the UI{' at ' + api_url.removesuffix('/api') if api_url else ''}, or",
        f"    PREFECT_API_URL={api_url or '<server>/api'} .venv/bin/python -m deployments.auth client -- "
        f".venv/bin/prefect deployment run '{by_hand}' --watch",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``--help`` says what it does; no PREFECT_API_URL, or no server answering there, is one line and exit 2."""
    from flows.cli import server_command

    args = server_command("python -m deployments.deploy", __doc__, argv, retrain_flags)
    if args.retrain_every_h <= 0:
        print(f"error: --retrain-every-h {args.retrain_every_h:g}: give more than 0 hours", file=sys.stderr)
        return 2
    return deploy(retrain_every=timedelta(hours=args.retrain_every_h))


def retrain_flags(parser) -> None:
    parser.add_argument(
        "--retrain-every-h",
        type=float,
        default=RETRAIN_INTERVAL.total_seconds() / 3600,
        help="a drift, or a labelled batch announced, starts at most one training run in this many hours "
        "(default %(default)g)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
