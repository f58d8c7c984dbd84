"""hypercorn's internals that `gateway/server/hypercorn.py` relies on are the ones it was written against.

The gateway replaces a few of hypercorn's internals (its connection's read
loop, write path and idle task, its lifespan's send).  hypercorn is pinned to
the versions they were read in; this test fails loudly, naming the internal,
when a new hypercorn changes one, so that an upgrade re-reads them first.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import re

from gateway.server.hypercorn import TOUCHED


def _pinned() -> str:
    spec = next(r for r in importlib.metadata.requires("trio-responses-gateway") or [] if r.startswith("hypercorn"))
    return spec


def test_hypercorn_is_pinned_to_the_versions_whose_internals_the_server_touches():
    pinned = _pinned()
    assert re.search(r"<\s*0\.\d+", pinned), f"hypercorn needs an upper bound in pyproject.toml: {pinned}"
    version = importlib.metadata.version("hypercorn")
    assert version.startswith("0.18."), f"hypercorn {version}: re-read the internals in TOUCHED, then widen the pin"


def test_every_hypercorn_internal_the_server_touches_is_unchanged():
    changed = {}
    for name, digest in TOUCHED.items():
        module, qualified = name.split(":")
        target = importlib.import_module(module)
        for part in qualified.split("."):
            target = getattr(target, part, None)
            assert target is not None, f"{name} is gone from this hypercorn"
        source = inspect.getsource(target)
        found = hashlib.sha256(source.encode()).hexdigest()[:12]
        if found != digest:
            changed[name] = found
    assert changed == {}, f"these hypercorn internals changed; read them again before recording the new digests: {changed}"


def test_the_attributes_the_server_reaches_for_are_where_it_expects_them():
    from hypercorn.protocol import ProtocolWrapper
    from hypercorn.protocol.h11 import H11Protocol
    from hypercorn.trio.task_group import TaskGroup
    from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

    assert MAX_RECV >= 1024
    assert "self.idle_task = TrioSingleTask()" in inspect.getsource(TCPServer.__init__)
    assert "self.protocol" in inspect.getsource(ProtocolWrapper.__init__)
    assert "self.connection: h11.Connection | H11WSConnection = h11.Connection(" in inspect.getsource(H11Protocol.__init__)
    assert "self._nursery = await" in inspect.getsource(TaskGroup.__aenter__)
    assert callable(getattr(TCPServer, "_initiate_server_close"))
