"""run heartbeat: gt_runs.heartbeat_at, refreshed while a tuner is alive

A tuner killed with SIGKILL cannot mark its run; a run whose heartbeat is older than a grace
period is taken as dead and marked "interrupted" by the next reader or tuner.

Revision ID: 0002_run_heartbeat
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002_run_heartbeat'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
    # Runs from before heartbeats: their last sign of life is when they started (or ended).
    op.execute("UPDATE gt_runs SET heartbeat_at = COALESCE(ended_at, started_at)")


def downgrade() -> None:
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.drop_column('heartbeat_at')
