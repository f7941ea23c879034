"""Create the verl_runs table: runs of trials' configs in verl itself.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verl_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('ok', 'oom', 'error', 'timeout')",
            name=op.f("ck_verl_runs_status_known"),
        ),
        sa.CheckConstraint("trial_number >= 0 AND round >= 0", name=op.f("ck_verl_runs_numbers_nonnegative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_verl_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_verl_runs")),
    )
    op.create_index("ix_verl_runs_job_id", "verl_runs", ["job_id", "trial_number"])


def downgrade() -> None:
    op.drop_index("ix_verl_runs_job_id", table_name="verl_runs")
    op.drop_table("verl_runs")
