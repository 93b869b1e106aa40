"""trial timings: gt_trials.timings, how many timings of the config its figure is the median of

A tuner re-times a shape's fastest configs at the shape's end, in shuffled rounds on one board
(tuner.run.retime), and stores in the trial the median of its first timing and the new ones;
``timings`` says how many. Trials from before, and those not re-timed, have none: one timing.

Revision ID: 0006_trial_timings
Revises: 0005_run_stale_after
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006_trial_timings'
down_revision: str | None = '0005_run_stale_after'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('gt_trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('timings', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('gt_trials', schema=None) as batch_op:
        batch_op.drop_column('timings')
