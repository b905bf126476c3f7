"""Requests that concern many nodes: batches split over the cluster, and fan-outs.

A batch of ``n`` is split by free room (:func:`~dsec.placement.choose.split_batch`) and
sent as one request per node, all at once; a 32,000-sandbox job is one call and about one
request per node. With a ``request_id`` each item is keyed ``<request_id>#<index>`` on
the node that makes it, and a retry first asks the nodes which items exist, then makes
only the missing ones: a client that retries never leaves orphans behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from dsec.api.errors import Capacity, Conflict, DSecError, NodeLost, NotFound
from dsec.api.scope import caller_scope
from dsec.api.models import (CreateManyRequest, ImageSummary, NodeInfo, SandboxInfo,
                             SandboxList, SandboxSpec, retry_mismatch)
from dsec.cluster.nodeclient import NodeClient
from dsec.gateway import metrics
from dsec.images.refs import check_tag_owner, normalize_ref

__all__ = ["create_one", "create_batch", "fan_out", "list_all", "healthy_clients", "lost_node",
           "runs", "list_images", "tag_free_elsewhere"]


def healthy_clients(gw) -> tuple[list[NodeClient], list[str]]:
    """The nodes to fan out to, and the ids of those left out as not answering."""
    ok, down = [], []
    for c in gw.cluster.clients():
        (ok if gw.watcher.healthy(c.node_id) else down).append(c)
    return ok, [c.node_id for c in down]


def lost_node(watcher, node_id: str, why: str | None = None) -> NodeInfo:
    """A node counted lost, as ``GET /v1/nodes`` shows it: the figures of its last answer
    (none if it never answered), why, and how long ago it last answered."""
    view = watcher.view(node_id)
    load = view.load if view is not None else None
    problem = why or (view.error if view is not None and view.error else "no answer")
    if view is not None and view.seen_at is not None:
        problem += f"; last answered {watcher.clock() - view.seen_at:.0f} s ago"
    return NodeInfo(id=node_id, backends=list(load.backends) if load else [],
                    cpus=load.cpus if load else 0, memory_mb=load.memory_mb if load else 0,
                    sandboxes=load.sandboxes if load else 0, running=None, healthy=False,
                    problem=problem,
                    memory_reserved_mb=load.memory_reserved_mb if load else None,
                    cpu_reserved=round(load.cpu_reserved, 2) if load else None)


def unsent(exc: BaseException) -> bool:
    """A node's failure that left the request unsent (its connect failed): safe to place
    elsewhere, since that node made nothing."""
    return isinstance(exc, NodeLost) and getattr(exc, "sent", True) is False


async def create_one(gw, spec: SandboxSpec) -> SandboxInfo:
    """One sandbox, on the node placement picks; a node that refuses (its admission has
    the last word), or could not be reached to be asked, is skipped and the next choice
    tried. Not the second with an idempotency key: a retry of it asks the key's node, so
    the sandbox must be there or nowhere. A node without the image (a snapshot is kept
    by the node that made it) is skipped too, key or not: it made nothing, and a retry
    takes the same nodes in the same order to the one that has it."""
    tried: list[str] = []
    while True:
        client = gw.placer.choose(spec.backend, spec.memory_mb, spec.cpu, exclude=tried,
                                  key=spec.request_id)
        try:
            return await client.create(spec)
        except Capacity:
            metrics.RETRIES.labels("refused").inc()
            if len(tried) + 1 >= len(gw.cluster.clients()):
                raise
        except NotFound:  # the image: a missing tag and a hidden one are asked alike
            metrics.RETRIES.labels("no_image").inc()
            if len(tried) + 1 >= len(gw.cluster.clients()):
                raise
        except NodeLost as exc:
            if not unsent(exc) or spec.request_id is not None \
                    or len(tried) + 1 >= len(gw.cluster.clients()):
                raise
            gw.watcher.report_failure(client.node_id, str(exc))
            metrics.RETRIES.labels("unreachable").inc()
        tried.append(client.node_id)


async def fan_out(gw, verb: str, *args, **kw) -> tuple[list, list[str]]:
    """``verb`` of every healthy node's client at once: the answers, and the nodes that
    did not answer (left out as unhealthy, or failing now), named rather than failing
    the whole call."""
    clients, down = healthy_clients(gw)
    got = await asyncio.gather(*(getattr(c, verb)(*args, **kw) for c in clients),
                               return_exceptions=True)
    answers = []
    for c, r in zip(clients, got):
        if isinstance(r, DSecError):
            down.append(c.node_id)
        elif isinstance(r, BaseException):
            raise r
        else:
            answers.append(r)
    return answers, down


async def list_all(gw, job: str | None = None, labels: dict[str, str] | None = None,
                   request_id: str | None = None) -> SandboxList:
    """The sandboxes of every healthy node; the others are named ``unreachable``."""
    parts, down = await fan_out(gw, "list", job=job, labels=labels or {},
                                request_id=request_id)
    return SandboxList(sandboxes=[i for part in parts for i in part], unreachable=down)


def runs(indices: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted indices as ``(first, count)`` runs of consecutive ones. Pure."""
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def _index(info: SandboxInfo, request_id: str) -> int | None:
    key = info.request_id or ""
    head, sep, tail = key.rpartition("#")
    return int(tail) if sep and head == request_id and tail.isdigit() else None


async def _existing(gw, request_id: str, project: str) -> dict[int, SandboxInfo]:
    """What earlier attempts of the batch ``request_id`` made in ``project`` (a key is
    its project's, as on the node: the same key in another project, which a parent's
    token also lists, is another batch), by item index. When some
    were found (so this is a retry) and nodes did not answer, the items not found may be
    on those: NodeLost, rather than make them a second time elsewhere. (A retry all of
    whose items are on nodes that do not answer cannot be told from a first attempt.)"""
    found, down = await fan_out(gw, "list", request_id=request_id)
    out: dict[int, SandboxInfo] = {}
    for infos in found:
        for info in infos:
            i = _index(info, request_id)
            if i is not None and info.project == project:
                out[i] = info
    if out and down:
        raise NodeLost(f"the batch with request_id {request_id[:80]!r} made {len(out)} "
                       f"sandboxes on the nodes that answer; node(s) {', '.join(down[:8])} "
                       "did not, and may hold the rest: retry when they are back, or use "
                       "another request_id for new sandboxes")
    return out


def _assign(shares: list[tuple[NodeClient, int]], missing: list[int]
            ) -> list[tuple[NodeClient, int, int]]:
    """Hand each node its share of the missing indices, as (node, first, count) runs."""
    out, pos = [], 0
    for client, n in shares:
        for first, count in runs(missing[pos:pos + n]):
            out.append((client, first, count))
        pos += n
    return out


async def create_batch(gw, req: CreateManyRequest) -> tuple[list[SandboxInfo], list[str]]:
    spec = req.spec
    wanted = list(range(req.first_index, req.first_index + req.count))
    made: dict[int, SandboxInfo] = {}
    if req.request_id is not None:
        project = spec.project if spec.project is not None else caller_scope.get() or ""
        made = await _existing(gw, req.request_id, project)
        for info in made.values():
            if why := retry_mismatch(spec, info):
                raise Conflict(why)
    errors: list[str] = []
    missing = [i for i in wanted if i not in made]
    refused: set[str] = set()
    for _ in range(3):  # a node that refuses its share: the rest go elsewhere, twice at most
        if not missing:
            break
        shares, _left = gw.placer.split(spec.backend, spec.memory_mb, spec.cpu, len(missing),
                                        exclude=refused)
        jobs = _assign(shares, missing)
        results = await asyncio.gather(*(
            c.create_many(n, spec, req.request_id, first) for c, first, n in jobs),
            return_exceptions=True)
        again: list[int] = []
        for (client, first, n), res in zip(jobs, results):
            idx = range(first, first + n)
            if isinstance(res, Capacity) or unsent(res):  # the items are made by a
                refused.add(client.node_id)              # retry key, so no orphan either
                again.extend(idx)
                metrics.RETRIES.labels("refused" if isinstance(res, Capacity)
                                       else "unreachable").inc()
                if unsent(res):
                    gw.watcher.report_failure(client.node_id, str(res))
            elif isinstance(res, DSecError):
                errors += [f"item {i}: {res.code}: {res}" for i in idx]
            elif isinstance(res, BaseException):
                raise res
            else:
                infos, errs = res
                for k, info in enumerate(infos):
                    made[_index(info, req.request_id) if req.request_id else first + k] = info
                errors += errs
        placed = {i for c, first, n in jobs for i in range(first, first + n)}
        missing = sorted(again) + [i for i in missing if i not in placed]
    if missing:
        why = f"{len(missing)} of {req.count} fit on no node: {_why_not(gw, spec, 1)}"
        errors += [f"item {i}: capacity: {why}" for i in missing]
    return [made[i] for i in wanted if i in made], errors  # not an earlier attempt's others


def _why_not(gw, spec, count: int) -> str:
    try:
        return gw.placer.why_not(spec.backend, spec.memory_mb, spec.cpu, count)
    except DSecError as exc:
        return str(exc)


async def list_images(gw) -> list[ImageSummary]:
    """The images the caller sees on every answering node, one per name (the newest, if
    nodes differ): a snapshot is on the node that made it, not on the first one only."""
    parts, _ = await fan_out(gw, "list_images")
    by_name: dict[str, ImageSummary] = {}
    for image in (i for part in parts for i in part):
        seen = by_name.get(image.name)
        if seen is None or image.created > seen.created:
            by_name[image.name] = image
    return list(by_name.values())


async def tag_free_elsewhere(gw, node_id: str, tag: str) -> None:
    """Conflict when the caller's project may not take snapshot tag ``tag`` on some node
    other than ``node_id`` (which checks for itself): each node keeps its own tags, so a
    project could otherwise take a shared image's or another project's tag on a node that
    has not got it yet, and a token above both would get either image by node. NodeLost
    when a node that may hold it does not answer. The root's token takes any tag."""
    project = caller_scope.get()
    if project is None or len(gw.cluster.clients()) < 2:
        return
    name = normalize_ref(tag)
    ok, down = healthy_clients(gw)  # one counted lost is not waited for
    others = [c for c in ok if c.node_id != node_id]
    down = [n for n in down if n != node_id]
    mark = caller_scope.set(None)  # every project's tags, not only those the caller sees
    try:
        got = await asyncio.gather(*(c.list_images() for c in others), return_exceptions=True)
    finally:
        caller_scope.reset(mark)
    for c, part in zip(others, got):
        if isinstance(part, BaseException):
            if not isinstance(part, DSecError):
                raise part
            down.append(c.node_id)
            continue
        for image in part:
            if image.name == name:
                check_tag_owner(name, image.project, project)
    if down:
        raise NodeLost(f"tag {name!r} is not taken: node(s) {', '.join(down)} do not answer, "
                       "and may hold it as a shared image or another project's snapshot; "
                       "snapshot again when they are back")
