"""Domain permissions, pure parts: matching names, rules and set elements."""

import dns.message
import dns.rrset
import pytest
from pydantic import ValidationError

from dsec.node.host.dns import (MIN_TIMEOUT_S, answer_addresses, check_domain, granted_sets,
                                matches, render_elements)
from dsec.node.host.netpolicy import Permission, render_allow, render_host_tables

PERMS = {"docs": Permission(addresses=["192.0.2.7"]),
         "pypi": Permission(domains=["PyPI.org.", "files.pythonhosted.org"], ports=[443])}


def test_a_domain_matches_itself_and_its_subdomains_only():
    assert matches("pypi.org.", ["pypi.org"]) and matches("www.PYPI.org", ["pypi.org"])
    assert not matches("evilpypi.org", ["pypi.org"]) and not matches("pypi.org.evil", ["pypi.org"])


def test_domains_are_normalised_and_checked():
    assert PERMS["pypi"].domains == ["pypi.org", "files.pythonhosted.org"]
    for bad in ("", "a..b", "-x.org", "x_y.org", "a" * 64 + ".org"):
        with pytest.raises(ValueError):
            check_domain(bad)
    with pytest.raises(ValidationError, match="address or domain"):
        Permission()


def test_only_granted_permissions_listing_the_name_open_sets():
    assert granted_sets("files.pythonhosted.org.", {"pypi": True}, PERMS) == ["dom_1"]
    assert granted_sets("files.pythonhosted.org.", {"pypi": False}, PERMS) == []
    assert granted_sets("example.org.", {"pypi": True, "docs": True}, PERMS) == []


def test_rules_send_dns_to_the_node_and_accept_the_set():
    out = render_allow({"pypi": True}, PERMS, "10.0.0.1").splitlines()
    assert out[0] == "add set inet dsec dom_1 { type ipv4_addr; flags timeout; }"
    assert ("add rule inet dsec dns ip daddr != 127.0.0.0/8 meta l4proto { tcp, udp } "
            "th dport 53 dnat ip to 10.0.0.1") in out
    assert ("add rule inet dsec allow ip daddr @dom_1 meta l4proto { tcp, udp } "
            "th dport { 443 } accept") in out


def test_without_domain_permissions_dns_is_not_redirected():
    out = render_allow({"docs": True}, PERMS, "10.0.0.1")
    assert "dnat" not in out and "dport 53" not in out and "flush chain inet dsec dns" in out


def test_host_tables_let_dns_reach_the_nodes_resolvers():
    text = render_host_tables("ab12cd3", "10.215.0.0/24")
    assert ('iifname "dsvab12cd3*" ip daddr 10.215.0.0/24 meta l4proto { tcp, udp } '
            "th dport 53 accept") in text


def test_answers_give_the_a_records_of_the_whole_chain():
    q = dns.message.make_query("files.pythonhosted.org", "A")
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text("files.pythonhosted.org.", 60, "IN", "CNAME",
                                        "cdn.example."))
    r.answer.append(dns.rrset.from_text("cdn.example.", 30, "IN", "A", "198.51.100.1",
                                        "198.51.100.2"))
    assert answer_addresses(r) == [("198.51.100.1", 30), ("198.51.100.2", 30)]


def test_set_elements_get_a_fresh_timeout_of_at_least_the_minimum():
    text = render_elements(["dom_0"], [("198.51.100.1", 5)])
    assert text.splitlines() == [
        f"add element inet dsec dom_0 {{ 198.51.100.1 timeout {MIN_TIMEOUT_S}s }}",
        "delete element inet dsec dom_0 { 198.51.100.1 }",
        f"add element inet dsec dom_0 {{ 198.51.100.1 timeout {MIN_TIMEOUT_S}s }}"]
