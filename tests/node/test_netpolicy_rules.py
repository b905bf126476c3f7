"""Rendering of the nftables rules and address slots: pure, no machine needed."""

import pytest
from pydantic import ValidationError

from dsec.node.host.netpolicy import (NetworkConfig, Permission, _denied_flows, next_slot,
                                      render_allow, slot_addresses)


def test_slots_are_disjoint_slash_30s():
    assert slot_addresses("10.213.0.0/16", 0) == ("10.213.0.1", "10.213.0.2")
    assert slot_addresses("10.213.0.0/16", 5) == ("10.213.0.21", "10.213.0.22")


def test_a_full_subnet_is_an_error():
    with pytest.raises(ValueError, match="no free sandbox address"):
        slot_addresses("10.0.0.0/30", 1)


def test_only_granted_permissions_become_accept_rules():
    perms = {"a": Permission(addresses=["192.0.2.7"], ports=[443, 80]),
             "b": Permission(addresses=["198.51.100.0/24"], protocols=["udp"])}
    out = render_allow({"a": True, "b": False}, perms).splitlines()
    assert out == ["flush chain inet dsec allow",
                   "add rule inet dsec allow ip daddr { 192.0.2.7/32 } "
                   "meta l4proto { tcp, udp } th dport { 80, 443 } accept"]
    assert render_allow({}, perms) == "flush chain inet dsec allow\n"


def test_permission_addresses_are_validated():
    with pytest.raises(ValidationError):
        Permission(addresses=["not-an-address"])
    with pytest.raises(ValidationError):
        NetworkConfig(permissions={"x": {"addresses": []}})


def test_denied_set_listing_becomes_flows():
    listing = {"nftables": [{"metainfo": {}}, {"set": {"name": "denied", "elem": [
        {"elem": {"val": {"concat": ["10.0.0.1", "tcp", 22]}, "counter": {"packets": 3}}}]}}]}
    [flow] = _denied_flows(listing)
    assert (flow.address, flow.protocol, flow.port, flow.packets) == ("10.0.0.1", "tcp", 22, 3)


def test_slots_go_round_robin_and_wrap():
    assert next_slot(set(), 0, 4) == 0
    assert next_slot({0}, 1, 4) == 1
    assert next_slot({1, 2}, 1, 4) == 3
    assert next_slot({3}, 3, 4) == 0
    with pytest.raises(ValueError, match="all 2 sandbox addresses"):
        next_slot({0, 1}, 0, 2)


def test_host_tables_are_per_node_and_match_only_its_veths():
    from dsec.node.host.netpolicy import host_tables, render_host_tables
    assert host_tables("ab12cd3") == (("inet", "dsec_ab12cd3"), ("ip", "dsec_ab12cd3_nat"))
    text = render_host_tables("ab12cd3")
    assert 'iifname "dsvab12cd3*" oifname != "dsv*" masquerade random' in text
    assert 'iifname "dsv*"' not in text  # never another node's sandboxes
