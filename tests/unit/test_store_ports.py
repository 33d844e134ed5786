"""The store ports stay narrow: each method of the store belongs to exactly one port
(core/ports.py), `Store` is their union and adds nothing, and every store implementation
provides exactly the union, each method with the port's signature. A new store method must
therefore be put in a port, and a consumer can keep asking for the narrowest one. And the
imports stay untangled: the memory store imports nothing of the SQL one, and no module of corral
is in an import circle."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grimp
import pytest

from corral.core import ports
from corral.core.ports import (
    AuditStore,
    BaselineStore,
    EngineRegistry,
    EpicStore,
    GovernanceStore,
    JobStore,
    KnowledgeStore,
    MetricsReads,
    OutboxReads,
    RetentionStore,
    RunReads,
    Store,
    StoreLifecycle,
    TokenStore,
    TraceStore,
    WorldReads,
)
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore

PORTS: tuple[type, ...] = (
    StoreLifecycle,
    JobStore,
    RunReads,
    TraceStore,
    GovernanceStore,
    AuditStore,
    EngineRegistry,
    OutboxReads,
    MetricsReads,
    TokenStore,
    RetentionStore,
    BaselineStore,
    WorldReads,
    EpicStore,
    KnowledgeStore,
)
IMPLEMENTATIONS: tuple[type, ...] = (MemoryStore, SqliteStore, PostgresStore)


def own_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods a class itself defines (not those it inherits)."""
    return {
        name: value
        for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """Every public method of a class, its own and inherited (object's apart)."""
    found: dict[str, Callable[..., Any]] = {}
    for base in reversed(cls.__mro__[:-1]):
        found.update(own_methods(base))
    return found


def shape(fn: Callable[..., Any]) -> tuple[bool, list[tuple[str, Any, bool]]]:
    """What a caller relies on: async or not, and each parameter's name, kind and whether it
    may be left out."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # self
    return inspect.iscoroutinefunction(fn), [
        (p.name, p.kind, p.default is not inspect.Parameter.empty) for p in params
    ]


UNION = {name: fn for port in PORTS for name, fn in own_methods(port).items()}


def test_each_store_method_is_in_exactly_one_port() -> None:
    seen: dict[str, str] = {}
    for port in PORTS:
        for name in own_methods(port):
            assert name not in seen, f"{name} is in both {seen[name]} and {port.__name__}"
            seen[name] = port.__name__
    assert all(own_methods(port) for port in PORTS)


def test_the_store_is_the_union_of_the_ports_and_adds_nothing() -> None:
    assert own_methods(Store) == {}
    assert set(Store.__mro__) >= set(PORTS)
    assert public_methods(Store) == UNION


def test_every_protocol_in_the_ports_module_that_is_a_store_port_is_listed() -> None:
    """A new port is added to `Store` and to this list (AttemptHandle, WorkerAdapter and
    AuditKey are ports of other things)."""
    store_ports = {
        cls
        for cls in vars(ports).values()
        if isinstance(cls, type) and cls in Store.__mro__ and cls is not Store and own_methods(cls)
    }
    assert store_ports == set(PORTS)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_an_implementation_provides_exactly_the_ports(impl: type) -> None:
    methods = public_methods(impl)
    assert set(methods) - set(UNION) == set(), "a public store method outside every port"
    assert set(UNION) - set(methods) == set(), "a port method the store does not implement"


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("port", PORTS, ids=lambda c: c.__name__)
def test_an_implementation_satisfies_each_port(impl: type, port: type) -> None:
    methods = public_methods(impl)
    for name, declared in own_methods(port).items():
        assert shape(methods[name]) == shape(declared), f"{impl.__name__}.{name}"


def test_the_memory_store_imports_nothing_of_the_sql_store() -> None:
    """The SQL side is whatever imports the SQL driver port (store/driver.py)."""
    graph = grimp.build_graph("corral", cache_dir=None)
    sql_side = {"corral.store.driver", *graph.find_downstream_modules("corral.store.driver")}
    for module in (
        "corral.store.memory",
        "corral.store.governance_memory",
        "corral.store.operator_memory",
    ):
        assert graph.find_upstream_modules(module) & sql_side == set(), module


def test_no_module_of_corral_is_in_an_import_circle() -> None:
    graph = grimp.build_graph("corral", cache_dir=None)
    circles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )
    assert circles == []
