"""tuning jobs: gt_jobs, a queue of (GPU model, problem, budget) that workers claim

Revision ID: 0003_jobs
Revises: 0002_run_heartbeat
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003_jobs'
down_revision: str | None = '0002_run_heartbeat'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "state IN ('queued', 'running')"


def upgrade() -> None:
    op.create_table('gt_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_name', sa.String(length=200), nullable=False),
    sa.Column('m', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=20), nullable=False),
    sa.Column('layout', sa.String(length=20), nullable=False),
    sa.Column('general_alpha_beta', sa.Boolean(), nullable=False),
    sa.Column('families', sa.JSON(), nullable=False),
    sa.Column('budget', sa.JSON(), nullable=False),
    sa.Column('origin', sa.String(length=20), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('worker', sa.String(length=255), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('run_ids', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed')", name=op.f('ck_gt_jobs_state')),
    sa.CheckConstraint('m > 0 AND n > 0 AND k > 0', name=op.f('ck_gt_jobs_positive_dims')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_jobs'))
    )
    with op.batch_alter_table('gt_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_gt_jobs_state_gpu', ['state', 'gpu_name', 'id'], unique=False)
        batch_op.create_index('uq_gt_jobs_open_problem',
                              ['gpu_name', 'm', 'n', 'k', 'dtype', 'layout', 'general_alpha_beta'],
                              unique=True, sqlite_where=sa.text(OPEN), postgresql_where=sa.text(OPEN))


def downgrade() -> None:
    with op.batch_alter_table('gt_jobs', schema=None) as batch_op:
        batch_op.drop_index('uq_gt_jobs_open_problem')
        batch_op.drop_index('ix_gt_jobs_state_gpu')

    op.drop_table('gt_jobs')
