"""``AsyncRLJobSpec.old_logits_route``: the one reading of (``correction.reference``, ``oldLogits.strategy``)."""

import pytest

from asyncrl.api.correction import CorrectionSpec, ReferencePolicy
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits import OldLogitsSpec, OldLogitStrategy
from asyncrl.api.old_logits_route import OldLogitsRoute, old_logits_route


@pytest.mark.parametrize("reference", [r for r in ReferencePolicy if r is not ReferencePolicy.EXACT])
def test_a_cheap_reference_takes_no_route(reference: ReferencePolicy) -> None:
    spec = AsyncRLJobSpec.model_validate({"correction": {"reference": reference.value}})
    assert spec.old_logits_route is OldLogitsRoute.NONE
    assert not spec.old_logits_route.scores_outside_the_actor


@pytest.mark.parametrize(("strategy", "route", "outside"), [
    ("snapshot", OldLogitsRoute.SNAPSHOT, False),  # the actor keeps the weights and scores itself
    ("interruptSync", OldLogitsRoute.INTERRUPT_SYNC, True),  # the rollout workers score
    ("dedicated", OldLogitsRoute.DEDICATED, True),  # the scorers do
])
def test_exact_takes_its_strategy_s_route(strategy: str, route: OldLogitsRoute, outside: bool) -> None:
    spec = AsyncRLJobSpec.model_validate({"correction": {"reference": "exact"}, "oldLogits": {"strategy": strategy}})
    assert spec.old_logits_route is route
    assert route.value == OldLogitStrategy(strategy).value  # the route is named as the strategy is
    assert spec.old_logits_route.scores_outside_the_actor is outside


def test_exact_without_a_strategy_names_the_field_and_the_choices() -> None:
    # Validation refuses this spec; the route of an unvalidated one says what is missing.
    correction = CorrectionSpec.model_construct(reference=ReferencePolicy.EXACT)
    with pytest.raises(ValueError, match="oldLogits.strategy is not set.*snapshot, dedicated, interruptSync"):
        old_logits_route(correction, OldLogitsSpec())
