"""dsec images and dsec nodes."""

from __future__ import annotations


def test_images_lists_busybox(cli):
    r = cli("images")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:5] == ["NAME", "DIGEST", "LAYERS", "SIZE", "AGE"]
    assert any(ln.split()[0] == "busybox:latest" for ln in r.stdout.splitlines()[1:])


def test_nodes_lists_the_local_node(cli, sync_client):
    r = cli("nodes")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == [n.id for n in sync_client.nodes()]
    assert rows[0][1] == "ok"
    assert "container" in rows[0][2]
