"""Client-port settings: address parsing and moving NCCL's own RAS off our port."""

import pytest

from rasd.services.client_port import move_nccl_ras_port, parse_addr


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("localhost:28028", ("localhost", 28028)),
        ("10.1.2.3:1", ("10.1.2.3", 1)),
        ("[::1]:28029", ("::1", 28029)),
    ],
)
def test_parse_addr(spec, expected):
    assert parse_addr(spec) == expected


@pytest.mark.parametrize("spec", ["localhost", ":28028", "host:port", "host:0", "host:70000", "[::1]"])
def test_parse_addr_rejects(spec):
    with pytest.raises(ValueError):
        parse_addr(spec)


def test_nccl_ras_moves_off_our_port_unless_the_user_placed_it():
    env: dict[str, str] = {}
    assert move_nccl_ras_port(env) == "localhost:28128" and env["NCCL_RAS_ADDR"] == "localhost:28128"
    env = {"TORCHRAS_ADDR": "[::1]:30000"}
    assert move_nccl_ras_port(env) == "[::1]:30100"
    for placed in ({"NCCL_RAS_ADDR": "localhost:1"}, {"NCCL_RAS_ENABLE": "0"}):
        env = dict(placed)
        assert move_nccl_ras_port(env) is None and env == placed
    assert move_nccl_ras_port({"TORCHRAS_ADDR": "off"}) is None
