"""Nodes that start together, as one Slurm srun starts them: real `gpumux serve` processes
launched at once on one PostgreSQL database, fresh or left at an older revision, all come up and
join, and the schema is migrated once.

The race is made tight without touching gpumux: the test holds, in an open transaction, what
every node's migration needs first (a migration of its own under way), until every node waits
on a lock in the database; then it rolls back and they all go at the same instant.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from postgres import Cluster
from reliability.conftest import DaemonProcess
from sqlalchemy import make_url, select

from cluster.conftest import POLL_S, NodeFactory
from gpumux.status import NodeState
from gpumux.storage.engine import Sessions, make_engine
from gpumux.storage.migrate import alembic_config
from gpumux.storage.models import Node

# A revision several migrations behind head, as an older gpumux left the database.
OLD_REVISION = "0004"
# Under the nodes' lock_timeout (30 s): the node waiting at the barrier must not give up there.
BARRIER_S = 20.0
# What each case's barrier holds: a CREATE TABLE alembic_version not yet committed (a fresh
# database's first migration), or the version table locked (an old one's upgrade under way).
BARRIERS = {
    "fresh": "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)",
    "old": "LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE",
}
# The sessions of the database's gpumux nodes that wait on a lock.
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
    "AND application_name = 'gpumux' AND wait_event_type = 'Lock'"
)


@contextmanager
def held(pg_cluster: Cluster, database: str, statement: str) -> Iterator[None]:
    """`statement` run in a transaction left open for the block, rolled back after it."""
    with (
        pg_cluster.connect(database) as connection,
        connection.transaction(force_rollback=True),
    ):
        connection.execute(statement.encode())
        yield


def released_together(pg_cluster: Cluster, database: str, nodes: list[DaemonProcess]) -> None:
    """Return once every node waits on a lock in the database (or BARRIER_S has passed, or a
    node exited): the barrier's holder lets them all go then."""
    deadline = time.monotonic() + BARRIER_S
    with pg_cluster.connect(database) as watcher:
        while time.monotonic() < deadline and all(node.running for node in nodes):
            (waiting,) = watcher.execute(WAITING.encode(), (database,)).fetchone() or (0,)
            if waiting == len(nodes):
                return
            time.sleep(POLL_S)


def head_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["fresh", "old"])
@pytest.mark.parametrize("count", [2, 4])
def test_nodes_started_at_once_all_come_up_join_and_migrate_the_schema_once(
    make_node: NodeFactory,
    cluster_db: Sessions,
    pg_cluster: Cluster,
    pg_database: str,
    count: int,
    database: str,
) -> None:
    if database == "old":
        command.upgrade(alembic_config(cluster_db.engine), OLD_REVISION)
        cluster_db.engine.dispose()
    name = make_url(pg_database).database
    assert name is not None
    names = [f"node{i}" for i in range(1, count + 1)]
    with held(pg_cluster, name, BARRIERS[database]):
        nodes = [make_node(node, serving=False) for node in names]
        released_together(pg_cluster, name, nodes)
    failed = []
    for node in nodes:
        try:
            node.serving()
        except AssertionError as error:
            failed.append(f"--- {node.home.name}: {error}")
    assert not failed, "\n".join(failed)

    with cluster_db.read() as session:
        joined = session.scalars(select(Node.name).where(Node.state == NodeState.active)).all()
        revision = MigrationContext.configure(session.connection()).get_current_revision()
    assert sorted(joined) == names
    assert revision == head_revision(pg_database)
    upgraded = [node for node in nodes if "upgrading schema" in node.log_path.read_text()]
    assert len(upgraded) == 1, [node.home.name for node in upgraded]
