"""Fixtures for the workload tests: sandboxes per isolation level, fake model servers."""

from __future__ import annotations

import pytest
from workload_helpers import FAST_LIMITS, FakeOpenAIServer

from trex.workloads.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandboxes():
    """One sandbox per isolation level and options, shared by the tests (each run is independent)."""
    made: dict[str, Sandbox] = {}

    def get(isolation: str, **options) -> Sandbox:
        key = f"{isolation}:{sorted(options.items())}"
        if key not in made:
            made[key] = Sandbox(FAST_LIMITS, isolation=isolation, **options)
        return made[key]

    yield get
    for sandbox in made.values():
        sandbox.close()


@pytest.fixture
def fake_server():
    servers = []

    def make(**options) -> FakeOpenAIServer:
        servers.append(FakeOpenAIServer(**options))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()
