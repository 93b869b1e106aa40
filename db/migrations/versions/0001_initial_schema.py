"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('gt_families',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('source_hash', sa.String(length=64), nullable=False),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_families')),
    sa.UniqueConstraint('name', 'source_hash', name='uq_gt_families_version')
    )
    with op.batch_alter_table('gt_families', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gt_families_name'), ['name'], unique=False)

    op.create_table('gt_gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('uuid', sa.String(length=100), nullable=False),
    sa.Column('compute_capability', sa.String(length=10), nullable=False),
    sa.Column('sm_count', sa.Integer(), nullable=False),
    sa.Column('memory_bytes', sa.BigInteger(), nullable=False),
    sa.Column('max_sm_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('driver_version', sa.String(length=50), nullable=True),
    sa.Column('cuda_version', sa.String(length=50), nullable=True),
    sa.Column('nvrtc_version', sa.String(length=50), nullable=True),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_gpus')),
    sa.UniqueConstraint('uuid', name=op.f('uq_gt_gpus_uuid'))
    )
    with op.batch_alter_table('gt_gpus', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gt_gpus_name'), ['name'], unique=False)

    op.create_table('gt_problems',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('m', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=20), nullable=False),
    sa.Column('layout', sa.String(length=20), nullable=False),
    sa.Column('general_alpha_beta', sa.Boolean(), nullable=False),
    sa.CheckConstraint('m > 0 AND n > 0 AND k > 0', name=op.f('ck_gt_problems_positive_dims')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_problems')),
    sa.UniqueConstraint('m', 'n', 'k', 'dtype', 'layout', 'general_alpha_beta', name='uq_gt_problems_shape')
    )
    op.create_table('gt_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('family_id', sa.Integer(), nullable=False),
    sa.Column('sampler', sa.String(length=100), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=True),
    sa.Column('budget', sa.JSON(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('command', sa.Text(), nullable=False),
    sa.Column('study_name', sa.String(length=255), nullable=True),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('running', 'finished', 'interrupted', 'failed')", name=op.f('ck_gt_runs_state')),
    sa.ForeignKeyConstraint(['family_id'], ['gt_families.id'], name=op.f('fk_gt_runs_family_id_gt_families')),
    sa.ForeignKeyConstraint(['gpu_id'], ['gt_gpus.id'], name=op.f('fk_gt_runs_gpu_id_gt_gpus')),
    sa.ForeignKeyConstraint(['problem_id'], ['gt_problems.id'], name=op.f('fk_gt_runs_problem_id_gt_problems')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_runs'))
    )
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.create_index('ix_gt_runs_gpu_problem', ['gpu_id', 'problem_id'], unique=False)

    op.create_table('gt_baselines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('library', sa.String(length=50), nullable=False),
    sa.Column('time_median_ms', sa.Float(), nullable=False),
    sa.Column('gflops', sa.Float(), nullable=False),
    sa.Column('sm_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('measured_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['gpu_id'], ['gt_gpus.id'], name=op.f('fk_gt_baselines_gpu_id_gt_gpus')),
    sa.ForeignKeyConstraint(['problem_id'], ['gt_problems.id'], name=op.f('fk_gt_baselines_problem_id_gt_problems')),
    sa.ForeignKeyConstraint(['run_id'], ['gt_runs.id'], name=op.f('fk_gt_baselines_run_id_gt_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_baselines'))
    )
    with op.batch_alter_table('gt_baselines', schema=None) as batch_op:
        batch_op.create_index('ix_gt_baselines_gpu_problem', ['gpu_id', 'problem_id', 'library'], unique=False)

    op.create_table('gt_trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('compile_seconds', sa.Float(), nullable=True),
    sa.Column('registers', sa.Integer(), nullable=True),
    sa.Column('shared_bytes', sa.Integer(), nullable=True),
    sa.Column('spill_bytes', sa.Integer(), nullable=True),
    sa.Column('occupancy', sa.Float(), nullable=True),
    sa.Column('time_min_ms', sa.Float(), nullable=True),
    sa.Column('time_median_ms', sa.Float(), nullable=True),
    sa.Column('time_max_ms', sa.Float(), nullable=True),
    sa.Column('launches', sa.Integer(), nullable=True),
    sa.Column('gflops', sa.Float(), nullable=True),
    sa.Column('sm_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("state IN ('ok', 'rejected', 'compile_error', 'launch_error', 'wrong_result', 'timeout', 'crashed', 'missing')", name=op.f('ck_gt_trials_state')),
    sa.ForeignKeyConstraint(['run_id'], ['gt_runs.id'], name=op.f('fk_gt_trials_run_id_gt_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gt_trials')),
    sa.UniqueConstraint('run_id', 'number', name='uq_gt_trials_run_number')
    )
    with op.batch_alter_table('gt_trials', schema=None) as batch_op:
        batch_op.create_index('ix_gt_trials_run_state_gflops', ['run_id', 'state', 'gflops'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('gt_trials', schema=None) as batch_op:
        batch_op.drop_index('ix_gt_trials_run_state_gflops')

    op.drop_table('gt_trials')
    with op.batch_alter_table('gt_baselines', schema=None) as batch_op:
        batch_op.drop_index('ix_gt_baselines_gpu_problem')

    op.drop_table('gt_baselines')
    with op.batch_alter_table('gt_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_gt_runs_gpu_problem')

    op.drop_table('gt_runs')
    op.drop_table('gt_problems')
    with op.batch_alter_table('gt_gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gt_gpus_name'))

    op.drop_table('gt_gpus')
    with op.batch_alter_table('gt_families', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gt_families_name'))

    op.drop_table('gt_families')
