"""Creates under a project's quota: admit (queued up to ``wait_s``), place, confirm.

The room is taken in the ledger before a node is asked, so creates in flight count
against the quota on every gateway sharing the store; it is confirmed with the sandbox's
id when the node answers and given back when it does not. A node's own API (no
projects) creates directly.
"""

from __future__ import annotations

from dsec.api.errors import Capacity, DSecError, Forbidden, Unauthorized
from dsec.api.models import CreateManyRequest, SandboxInfo, SandboxSpec
from dsec.api.projects import within
from dsec.gateway.projects.quota import Ask
from dsec.gateway.spread import create_batch
from dsec.gateway.spread import create_one as _place_one

__all__ = ["owned", "create_one", "create_many", "place", "stop"]


def owned(gw, who, spec: SandboxSpec) -> SandboxSpec:
    """``spec`` in the caller's project (or the one below it that it names)."""
    if spec.project is None:
        return spec.model_copy(update={"project": who.project})
    if not within(spec.project, who.project):
        raise Forbidden(f"project {spec.project!r} is not at or below this token's project "
                        f"{who.project or '(root)'!r}")
    gw.projects.store.quota(spec.project)  # NotFound if there is no such project
    return spec


async def place(gw, spec: SandboxSpec) -> SandboxInfo:
    """On the node placement picks, the next choice tried after a refusal."""
    return await _place_one(gw, spec)


async def create_one(gw, who, spec: SandboxSpec) -> SandboxInfo:
    spec = owned(gw, who, spec)
    ledger = gw.projects.ledger

    async def attempt(res) -> SandboxInfo:
        still_valid(gw, who)  # it may have waited in line
        info = await place(gw, spec)
        ledger.confirm([(res.keys[0], info.id, info.node)])
        return info

    return await gw.projects.admission.hold(spec.project, Ask(1, spec.cpu, spec.memory_mb),
                                            spec.wait_s, attempt, Capacity)


async def create_many(gw, who, req: CreateManyRequest) -> tuple[list[SandboxInfo], list[str]]:
    """The batch admitted in runs: as many items as fit now are made, the rest wait in
    line (up to ``spec.wait_s``, keeping the batch's place) for the next room; what never
    fits is a per-item ``quota_exceeded`` error."""
    spec = owned(gw, who, req.spec)
    ledger, admission = gw.projects.ledger, gw.projects.admission
    made: list[SandboxInfo] = []
    errors: list[str] = []
    first = req.first_index

    async def run(res) -> None:
        nonlocal first
        n = len(res.keys)
        part = req.model_copy(update={"spec": spec, "count": n, "first_index": first})
        try:
            still_valid(gw, who)  # it may have waited in line
            got, errs = await create_batch(gw, part)
        except BaseException:
            admission.give_back(res.keys)
            raise
        ledger.confirm([(k, i.id, i.node) for k, i in zip(res.keys, got)])
        admission.give_back(res.keys[len(got):])
        made.extend(got)
        errors.extend(errs)
        first += n

    try:
        exc: DSecError | None = await admission.in_runs(
            spec.project, Ask(req.count, spec.cpu, spec.memory_mb), spec.wait_s, run)
    except Unauthorized as revoked:
        if not made:
            raise
        exc = revoked  # the runs made before stand; the rest are refused
    if exc is not None:
        end = req.first_index + req.count
        errors.extend(f"item {i}: {exc.code}: {exc.message}" for i in range(first, end))
    return made, errors


def still_valid(gw, who) -> None:
    """Unauthorized if ``who``'s token stopped working since the request came (revoked,
    expired, its project deleted): a create that waited in line makes nothing then."""
    if not gw.projects.still_valid(who):
        raise Unauthorized("the token of this create was revoked, expired or lost its "
                           "project while it waited for room; nothing was created")


async def stop(gw, client, sb_id: str) -> None:
    """Stop ``sb_id`` on its node and give its room back at once (the head of its
    project's queue tries again now, not at the next reconcile)."""
    await client.stop(sb_id)
    if gw.projects is not None:
        gw.projects.ledger.stopped(sb_id)
        gw.projects.admission.freed()
