"""The node's network and audit verbs, over :mod:`dsec.node.host.netpolicy`.

Functions of a :class:`~dsec.node.service.NodeService` rather than methods, so the service
module stays about lifecycles.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dsec.api.errors import DSecError
from dsec.api.rl import AuditRecord, NetworkStatus

if TYPE_CHECKING:
    from dsec.node.service import NodeService

__all__ = ["set_network", "network_status", "audit_records", "keep_network_audit"]

log = logging.getLogger("dsec.node")


async def set_network(node: NodeService, sb_id: str, allow: dict[str, bool]) -> NetworkStatus:
    """Change a running sandbox's egress permissions (between task stages, say)."""
    rec = node.record(sb_id)
    await node.network.set(rec, allow, list(node.records.values()))
    rec.spec = rec.spec.model_copy(update={"network": dict(allow)})
    node.store.put(rec)
    return await network_status(node, sb_id)


async def network_status(node: NodeService, sb_id: str) -> NetworkStatus:
    rec = node.record(sb_id)
    dropped, denied = await node.network.status(rec)
    allow = {} if rec.spec.network == "none" else dict(rec.spec.network)
    return NetworkStatus(sandbox_id=sb_id, allow=allow,
                         address=rec.runtime.get("net", {}).get("address"),
                         dropped=dropped, denied=denied,
                         denied_domains=node.network.refused_names(rec))


async def audit_records(node: NodeService, sb_id: str) -> list[AuditRecord]:
    """Denied actions of a sandbox: those logged, then its refused network destinations."""
    records = node.trajectory.log.audit_records(sb_id)
    rec = node.records.get(sb_id)
    if rec is not None:
        status = await network_status(node, sb_id)
        records += [AuditRecord(sandbox_id=sb_id, at=rec.last_active_at, kind="network_denied",
                                detail=f"{f.protocol} {f.address}:{f.port}", count=f.packets)
                    for f in status.denied]
        records += [AuditRecord(sandbox_id=sb_id, at=rec.last_active_at, kind="dns_denied",
                                detail=name, count=n)
                    for name, n in status.denied_domains.items()]
    return records


async def keep_network_audit(node: NodeService, rec) -> None:
    """Before a sandbox with egress stops, its refused destinations go into the audit log
    (while it runs they are read live from its namespace)."""
    if "net" not in rec.runtime:
        return
    for name, n in node.network.forget(rec).items():  # its resolver ends with it
        node.trajectory.log.audit(rec.id, "dns_denied", name, n)
    try:
        _, denied = await node.network.status(rec)
    except DSecError as exc:  # never let auditing block a stop
        log.warning("could not read network denials of %s: %s", rec.id, exc)
        return
    for f in denied:
        node.trajectory.log.audit(rec.id, "network_denied", f"{f.protocol} {f.address}:{f.port}",
                                  f.packets)
