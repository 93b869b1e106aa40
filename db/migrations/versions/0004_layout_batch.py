"""layouts, batches and workloads: gt_problems.batch, gt_jobs.batch; layouts nn / nt / tn / tt;
gt_workloads

A problem is now (M, N, K, batch, dtype, layout, general alpha/beta). Layouts name how A and B
are stored (kernels/layout.py): what every earlier result measured, row-major A times row-major
B, is "nn" (it was spelled "row-major"). Existing problems and jobs are single GEMMs: batch 1.
gt_workloads holds recorded workloads (db/workloads.py).

Revision ID: 0004_layout_batch
Revises: 0003_jobs
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004_layout_batch'
down_revision: str | None = '0003_jobs'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "state IN ('queued', 'running')"
PROBLEM_KEY = ['m', 'n', 'k', 'dtype', 'layout', 'general_alpha_beta']
JOB_KEY = ['gpu_name', 'm', 'n', 'k', 'dtype', 'layout', 'general_alpha_beta']


def upgrade() -> None:
    with op.batch_alter_table('gt_problems', schema=None) as batch_op:
        batch_op.add_column(sa.Column('batch', sa.Integer(), nullable=False, server_default='1'))
        batch_op.drop_constraint('uq_gt_problems_shape', type_='unique')
        batch_op.create_unique_constraint('uq_gt_problems_shape', PROBLEM_KEY[:3] + ['batch'] + PROBLEM_KEY[3:])
        batch_op.create_check_constraint('positive_batch', 'batch > 0')
    with op.batch_alter_table('gt_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('batch', sa.Integer(), nullable=False, server_default='1'))
        batch_op.drop_index('uq_gt_jobs_open_problem')
        batch_op.create_index('uq_gt_jobs_open_problem', JOB_KEY[:4] + ['batch'] + JOB_KEY[4:], unique=True,
                              sqlite_where=sa.text(OPEN), postgresql_where=sa.text(OPEN))
    op.execute("UPDATE gt_problems SET layout = 'nn' WHERE layout = 'row-major'")
    op.execute("UPDATE gt_jobs SET layout = 'nn' WHERE layout = 'row-major'")
    op.create_table('gt_workloads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('gpu_name', sa.String(length=200), nullable=True),
    sa.Column('problems', sa.JSON(), nullable=False),
    sa.Column('gemm_ms', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_workloads'))
    )


def downgrade() -> None:
    op.drop_table('gt_workloads')
    op.execute("DELETE FROM gt_jobs WHERE batch <> 1 OR layout <> 'nn'")
    op.execute("UPDATE gt_jobs SET layout = 'row-major'")
    op.execute("UPDATE gt_problems SET layout = 'row-major' WHERE layout = 'nn' AND batch = 1")
    with op.batch_alter_table('gt_jobs', schema=None) as batch_op:
        batch_op.drop_index('uq_gt_jobs_open_problem')
        batch_op.create_index('uq_gt_jobs_open_problem', JOB_KEY, unique=True,
                              sqlite_where=sa.text(OPEN), postgresql_where=sa.text(OPEN))
        batch_op.drop_column('batch')
    with op.batch_alter_table('gt_problems', schema=None) as batch_op:
        batch_op.drop_constraint('ck_gt_problems_positive_batch', type_='check')
        batch_op.drop_constraint('uq_gt_problems_shape', type_='unique')
        batch_op.create_unique_constraint('uq_gt_problems_shape', PROBLEM_KEY)
        batch_op.drop_column('batch')
