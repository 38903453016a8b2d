"""Human approval of a promotion on a real Prefect server: the flow run pauses on its form, and is answered
through the API exactly as the UI's Resume button answers it (``resume_flow_run`` with ``run_input``)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.flow_runs import resume_flow_run

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.evaluation.evaluate import evaluate_scores
from tasks.evaluation.score import score_images
from tasks.registry import PromotionPolicy, resolve
from tasks.registry.card import model_card_key
from tasks.registry.manage import model_versions, show_version
from tasks.registry.prefect_tasks import settle_promotion
from tests.helpers import card_versions, register_colours, wait_for

NAME = "colours-approval"  # its own model card: other tests count the versions of theirs
FLOW_NAME = "register-with-approval"
_ONE_AT_A_TIME = threading.Lock()  # the paused run is found by its flow's name: one such run at a time


@pytest.fixture(scope="module")
def evaluation(trained_model, colour_image_dirs):
    return evaluate_scores(score_images(ModelDirectory(trained_model), ImageDirectory(colour_image_dirs[1])))


@pytest.fixture(scope="module")
def register_with_approval(trained_model, colour_image_dirs, evaluation):
    @flow(name=FLOW_NAME)
    def register_with_approval(registry: str, timeout_s: int = 120):
        policy = PromotionPolicy(promote_to="production", approval=True)
        registered = register_colours(registry, NAME, trained_model, colour_image_dirs, evaluation.figures(), policy)
        return settle_promotion(registry, registered, timeout_s)

    return register_with_approval


def paused_run(timeout: float = 60):
    """The flow run waiting for approval, once it has paused (its form saved)."""
    waiting = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    named = FlowFilter(name=FlowFilterName(any_=[FLOW_NAME]))
    with get_client(sync_client=True) as client:
        runs = wait_for(
            lambda: client.read_flow_runs(flow_filter=named, flow_run_filter=waiting),
            timeout,
            interval=0.5,
            what="the flow run to pause",
        )
    return runs[0]


def form_description(run) -> str:
    keys = run.state.state_details.run_input_keyset
    with get_client(sync_client=True) as client:
        return client.read_flow_run_input(run.id, keys["description"])


def answered(run_flow, registry: str, answer: dict | None, timeout_s: int = 120):
    """Run the flow in a thread; answer its pause with ``answer`` (None: never); its result and the paused run."""
    with _ONE_AT_A_TIME, ThreadPoolExecutor(1) as pool:
        result = pool.submit(run_flow, registry, timeout_s)
        run = paused_run()
        if answer is not None:
            for nameless in ({k: v for k, v in answer.items() if k != "reviewer"}, {**answer, "reviewer": "  "}):
                with pytest.raises(RuntimeError, match="Cannot resume this run.*reviewer"):
                    resume_flow_run(run.id, run_input=nameless)  # refused: the run stays paused
            resume_flow_run(run.id, run_input=answer)
        return result.result(timeout=180), run


def test_an_approved_promotion_moves_the_alias_and_is_recorded(
    prefect_server, register_with_approval, evaluation, tmp_path
):
    registry = str(tmp_path / "registry")
    answer = {"decision": "approve", "reviewer": "ada", "comment": "better on every figure"}
    result, run = answered(register_with_approval, registry, answer)

    description = form_description(run)
    assert f"### Promote {NAME} version 1 to `production`?" in description
    assert f"| accuracy (decides) | {evaluation.accuracy:.4g} | none |" in description
    promotion = result.registration.promotion
    assert promotion.promoted and not promotion.awaiting_approval
    assert resolve(registry, f"{NAME}@production").version == 1
    approval = show_version(registry, f"{NAME}/1").approval
    assert (approval.decision, approval.reviewer, approval.comment) == ("approved", "ada", "better on every figure")
    assert approval.flow_run_id == str(run.id) == promotion.approval.flow_run_id
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.type == StateType.COMPLETED
    card = [c for c in asyncio.run(card_versions(model_card_key(NAME))) if c.flow_run_id == run.id][-1]
    assert f"approved by ada, {approval.answered_at:%Y-%m-%d %H:%M} UTC: “better on every figure”" in card.data

    # A version that does not beat the champion (the same model again) is not put to anyone.
    again = register_with_approval(registry, 5)
    assert not again.registration.promotion.promoted and again.registration.promotion.approval is None
    assert [v.registration.version for v in model_versions(registry, NAME) if v.approval] == [1]


def test_a_rejected_promotion_leaves_the_alias_and_is_recorded(prefect_server, register_with_approval, tmp_path):
    registry = str(tmp_path / "registry")
    result, run = answered(register_with_approval, registry, {"decision": "reject", "reviewer": "bob", "comment": "no"})
    assert not result.registration.promotion.promoted
    with pytest.raises(Exception, match="no alias 'production'"):
        resolve(registry, f"{NAME}@production")
    assert show_version(registry, f"{NAME}/1").approval.decision == "rejected"


def test_no_answer_in_time_is_not_promoted_and_the_run_completes(prefect_server, register_with_approval, tmp_path):
    registry = str(tmp_path / "registry")
    result, run = answered(register_with_approval, registry, None, timeout_s=3)
    assert not result.registration.promotion.promoted
    approval = show_version(registry, f"{NAME}/1").approval
    assert (approval.decision, approval.comment) == ("timed out", "no answer within 3 s")
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.type == StateType.COMPLETED


def test_the_pipeline_and_its_deployments_take_approval_as_parameters():
    from flows.pipeline import train_pipeline

    # One promotion parameter (PromotionPolicy) in the run form: its approval fields, with their defaults.
    schema = train_pipeline.parameters
    assert schema.properties["promotion"]["$ref"] == "#/definitions/PromotionPolicy"
    properties = schema.definitions["PromotionPolicy"]["properties"]
    assert properties["approval"]["default"] is False and properties["approval_timeout_s"]["default"] == 3600
    assert "pauses on a form" in properties["approval"]["description"]
