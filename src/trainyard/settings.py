"""Settings from ``TRAINYARD_*`` environment variables (DESIGN §3.5). Built once, passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".trainyard")
    database_url: str | None = None
    url: str = "http://127.0.0.1:8080"
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    executor: str = "local"
    ray_address: str | None = None
    # local paths every Ray node mounts (comma-separated); file:// checkpoint storage must lie under one
    ray_shared_paths: str | None = None
    # fsspec URL of the one storage root (DESIGN §3.6); default file://$TRAINYARD_HOME/storage
    storage_url: str | None = None
    # bearer token that may read /metrics besides an admin key
    metrics_token: str | None = None
    # how workers are isolated: "bwrap" (bubblewrap, unprivileged uid, scrubbed environment) or "none"
    # (workers run as the server's user; only for development on a machine without bubblewrap)
    sandbox: str = "bwrap"
    reserved_discount_1y: float = 0.35
    reserved_discount_3y: float = 0.55
    # where rate-limit buckets live: auto (the database on PostgreSQL, so every server process shares
    # them; in process on SQLite), memory, or database
    rate_limit_backend: str = "auto"
    # MLflow tracking server the jobs are mirrored to (optional extra trainyard[mlflow]); None: no mirror
    mlflow_tracking_uri: str | None = None
    dataset_max_bytes: int = 2 * 2**30  # upload limit of one dataset file
    # step metrics at training resolution: every N-th step is logged, at most this many rows a second
    # per job (0: no bound); the first and last steps always are
    metrics_every_steps: int = Field(default=1, ge=1)
    metrics_max_rows_per_s: float = Field(default=100.0, ge=0)
    # alert webhooks: networks (CIDRs, comma-separated) a webhook may resolve to besides public addresses
    # (e.g. "127.0.0.1/32" for a receiver on this machine); retries with exponential backoff
    webhook_allowed_networks: str = ""
    webhook_max_attempts: int = Field(default=5, ge=1, le=20)
    webhook_backoff_initial_s: float = Field(default=1.0, gt=0)
    webhook_backoff_max_s: float = Field(default=60.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    # alert rules (docs/observability.md)
    alert_stalled_after_s: float = Field(default=600.0, gt=0)
    alert_loss_divergence_factor: float = Field(default=3.0, gt=1)
    alert_loss_min_steps: int = Field(default=20, ge=1)
    alert_deployment_window_s: float = Field(default=300.0, gt=0)
    alert_deployment_min_requests: int = Field(default=20, ge=1)
    alert_deployment_error_rate: float = Field(default=0.05, ge=0, le=1)
    alert_deployment_p95_latency_s: float = Field(default=10.0, gt=0)
    alert_scan_interval_s: float = Field(default=5.0, ge=0)
    # storage metering (docs/governance.md): datasets, checkpoints and models billed in GB-hours per
    # complete interval. Default price: Amazon S3 Standard, first 50 TB/month, us-east-1, $0.023 per
    # GB-month (https://aws.amazon.com/s3/pricing/), a month taken as 730 hours
    storage_price_usd_per_gb_month: float = Field(default=0.023, ge=0)
    storage_accrual_interval_s: float = Field(default=3600.0, gt=0)
    # log level of the server's structured logs (debug, info, warning, error)
    log_level: str = "info"
    # running jobs that get per-job training series on /metrics (newest first; the rest are counted)
    metrics_max_job_series: int = 500

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'trainyard.db'}"

    @property
    def resolved_storage_url(self) -> str:
        if self.storage_url:
            return self.storage_url
        return (Path(self.home) / "storage").resolve().as_uri()

    @property
    def api_key_path(self) -> Path:
        return self.home / "api_key"


def load_settings() -> Settings:
    return Settings()
