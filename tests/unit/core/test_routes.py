"""The wiring diagram pinned (issue 41): every effect a room can return has a room that takes it (``node.ROUTES``),
actions go to the driver, and neither the node nor either driver drops a value it does not know in silence."""

import dataclasses
import typing
from unittest.mock import MagicMock

import pytest

from rasd.core import effects as fx
from rasd.core.actions import Action
from rasd.core.node import ROUTES, Node
from rasd.net.runtime import Runtime
from rasd.sim.network import Simulation

EFFECTS = typing.get_args(fx.Effect)
ACTIONS = typing.get_args(Action)


def test_every_effect_has_a_route_and_every_route_is_an_effect():
    assert EFFECTS and ACTIONS
    assert set(EFFECTS) == set(ROUTES), {t.__name__ for t in set(EFFECTS) ^ set(ROUTES)}
    assert not set(ACTIONS) & set(ROUTES)  # actions pass through to the driver


def test_the_node_raises_on_an_effect_nobody_takes():
    @dataclasses.dataclass(frozen=True)
    class Stray:
        pass

    node = MagicMock(spec=Node)
    with pytest.raises(TypeError, match="no room takes the effect Stray"):
        Node._run(node, [Stray()])


def _instance(kind: type) -> object:
    return kind(*(MagicMock() for _ in dataclasses.fields(kind)))


@pytest.mark.parametrize(
    "act", [lambda a: Runtime._act(MagicMock(), a), lambda a: Simulation._act(MagicMock(), MagicMock(), a)]
)
def test_both_drivers_handle_every_action_and_raise_on_any_other(act):
    for kind in ACTIONS:
        try:
            act(_instance(kind))
        except TypeError as error:  # a mock compared with a number, say: the action had a branch
            assert "no handler" not in str(error), kind
        except Exception:  # noqa: BLE001 - mocks in a branch: handled
            pass
    with pytest.raises(TypeError, match="no handler for the action object"):
        act(object())
