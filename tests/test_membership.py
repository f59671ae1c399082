"""What is known of the user groups slack_actors lists (alerts.membership), with the clock and
Slack's answers given: asked once a group per time kept, the failure kept too, never taken on
old members. The link and the real slack-sdk around it are in test_slack_link.py."""

from __future__ import annotations

from lossguard.alerts.delivery import Delivery
from lossguard.alerts.membership import FAILED_FOR, GROUPS_FOR, Membership

DOWN = Delivery(ok=False, error="service_unavailable", permanent=False)


def _membership(answers: dict[str, list]):  # noqa: ANN202
    now, asked = [1000.0], []

    def ask(group: str):  # noqa: ANN202
        asked.append(group)
        return answers[group].pop(0)

    return Membership(["S0A", "S0B"], ask, clock=lambda: now[0]), now, asked


def test_nothing_is_known_before_slack_is_asked_and_settled_it_is_a_refusal_not_a_guess():
    m, _, asked = _membership({})
    assert m.of("U1") is None and asked == []
    assert m.of("U1", settled=True) == (frozenset(), frozenset({"S0A", "S0B"}))


def test_a_user_found_in_one_group_does_not_wait_for_the_other():
    m, _, asked = _membership({"S0A": [frozenset({"U1"})], "S0B": [DOWN]})
    m.refresh()
    assert m.of("U1") == (frozenset({"S0A"}), frozenset()) and m.of("U2") == (frozenset(), frozenset({"S0B"}))
    assert asked == ["S0A", "S0B"]


def test_a_failure_is_kept_its_time_then_asked_again_and_members_theirs():
    m, now, asked = _membership({"S0A": [DOWN, frozenset({"U1"})], "S0B": [frozenset(), frozenset()]})
    m.refresh()
    m.refresh()  # (a second click behind the first: nothing asked)
    assert asked == ["S0A", "S0B"] and m.of("U1") == (frozenset(), frozenset({"S0A"}))
    now[0] += FAILED_FOR
    assert m.of("U1") is None
    m.refresh()
    assert asked == ["S0A", "S0B", "S0A"] and m.of("U1") == (frozenset({"S0A"}), frozenset())
    now[0] += GROUPS_FOR - FAILED_FOR
    assert m.of("U2") is None  # (S0B's members are over: asked again, never kept past their time)
