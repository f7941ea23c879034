"""Add the jobs' idempotency key and the hash of the request that created each.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("request_sha256", sa.String(64), nullable=True))
        batch.create_unique_constraint(op.f("uq_jobs_idempotency_key"), ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("uq_jobs_idempotency_key"), type_="unique")
        batch.drop_column("request_sha256")
        batch.drop_column("idempotency_key")
