"""The spawn frame's size bound: check_spawn skips encoding a frame whose bound is below
the agent's limit, so the bound must never be smaller than the frame."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsec.api.errors import InvalidArgument
from dsec.api.limits import AGENT_MAX_FRAME
from dsec.node.agent.client import SpawnRequest
from dsec.node.execution import _frame_bound, check_spawn

text = st.text(st.characters(codec="utf-8") | st.characters(min_codepoint=0xDC80,
                                                           max_codepoint=0xDCFF))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.lists(text, min_size=1), env=st.dictionaries(text, text), cwd=text,
       tag=text, protect=st.lists(text), nolink=st.lists(text),
       uid=st.integers(0, 2**32 - 1), rows=st.integers(0, 2**16), keep=st.booleans(),
       reuse=st.booleans())
def test_bound_is_never_below_the_frame(argv, env, cwd, tag, protect, nolink, uid, rows,
                                         keep, reuse):
    spawn = SpawnRequest(argv=argv, env=env, cwd=cwd, uid=uid, gid=uid, rows=rows,
                         cols=rows, keep=keep, tag=tag, protect=protect, nolink=nolink)
    assert _frame_bound(spawn) >= len(spawn.encode(reuse=reuse))


def test_a_frame_past_the_limit_is_still_refused():
    spawn = SpawnRequest(argv=["\x01" * (AGENT_MAX_FRAME // 6 + 1)], env={})
    with pytest.raises(InvalidArgument, match="encode to"):
        check_spawn(spawn)
