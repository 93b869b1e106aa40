"""run stale-after: gt_runs.stale_after_s, the heartbeat age after which a run's tuner is dead

A run records the stale-after time its tuner was started with (--stale-after), so that any
reader (the API, the dashboard) marks it "interrupted" once its heartbeat is older than that,
instead of waiting for another tuner to start. Runs from before have none: readers use the
default (db.DEFAULT_STALE_AFTER_S).

Revision ID: 0005_run_stale_after
Revises: 0004_layout_batch
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005_run_stale_after'
down_revision: str | None = '0004_layout_batch'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stale_after_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.drop_column('stale_after_s')
