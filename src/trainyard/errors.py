"""One error hierarchy for the whole platform.

Every error carries a stable machine-readable ``code``, a one-line ``message``, a ``hint`` telling the
user what to do next, and optional structured ``details``. The class decides the HTTP status the API
answers with and the exit code the CLI ends with, so both surfaces stay consistent.
"""

from __future__ import annotations

from typing import Any, ClassVar

MAX_LISTED_ERRORS = 50  # a message names every validation error up to this many (details has them all)


def list_errors(errors: list[dict[str, Any]]) -> str:
    """Every validation error in one message: ``field: message; field: message`` (the first 50, and how
    many there are beyond; ``details.errors`` always holds the whole list)."""
    head = errors[:MAX_LISTED_ERRORS]
    shown = [f"{e.get('field', '(input)')}: {e.get('message', 'invalid')}" for e in head]
    text = "; ".join(shown) or "invalid input"
    if len(errors) > MAX_LISTED_ERRORS:
        text += f"; {len(errors) - MAX_LISTED_ERRORS} further errors are in details.errors"
    return text


class TrainyardError(Exception):
    """Base of every error trainyard raises on purpose."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    default_hint: ClassVar[str] = "This is a bug in trainyard; please report it with the command you ran."

    def __init__(self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.details: dict[str, Any] = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The API error envelope body (DESIGN §3.5)."""
        return {"code": self.code, "message": self.message, "hint": self.hint, "details": self.details}

    def __str__(self) -> str:
        return self.message


class InvalidInputError(TrainyardError):
    """The user's input (a spec, a pools file, a request body) is malformed or out of range."""

    code = "invalid_input"
    http_status = 422
    exit_code = 2
    default_hint = "Fix the field named above and try again."


class SpecError(InvalidInputError):
    """A job spec failed validation; ``details['errors']`` lists every failing field path."""

    code = "invalid_spec"
    default_hint = "Run `trainyard spec schema` for the allowed fields and values."


class UnknownAcceleratorError(InvalidInputError):
    code = "unknown_accelerator"
    default_hint = "Run `trainyard catalog accelerators` for the accepted names."


class StorageNotAllowedError(InvalidInputError):
    """A path or URL outside the storage the tenant may use (DESIGN §3.6); says nothing about what
    exists there."""

    code = "storage_not_allowed"
    default_hint = "Use a URL under your tenant's storage, or name the data by id."


class UrlNotAllowedError(InvalidInputError):
    """An outbound URL a tenant gave (a webhook) that the server will not call: not http(s), or one that
    resolves to a loopback, private, link-local or otherwise internal address."""

    code = "url_not_allowed"
    default_hint = (
        "Use a public http(s) URL; an operator can allow internal networks with "
        "TRAINYARD_WEBHOOK_ALLOWED_NETWORKS (CIDRs, comma-separated)."
    )


class SandboxUnavailableError(TrainyardError):
    """User code and the trainer run only inside the sandbox; it cannot be set up on this machine."""

    code = "sandbox_unavailable"
    http_status = 503
    exit_code = 8
    default_hint = "Install bubblewrap (`apt-get install -y bubblewrap`) and allow user namespaces."


class PoolsFileError(InvalidInputError):
    code = "invalid_pools"
    default_hint = "Each pool needs name, accelerator, devices_per_node, nodes, market and region."


class NotFoundError(TrainyardError):
    code = "not_found"
    http_status = 404
    exit_code = 3
    default_hint = "Check the identifier; list what exists with the matching `list` command."


class InvalidDatasetError(InvalidInputError):
    """Rows of an upload failed validation; ``details.errors`` lists every bad line (up to a limit)."""

    code = "invalid_dataset"
    default_hint = "Fix the lines listed in details.errors (line numbers count from 1) and upload again."


class UnknownDatasetError(NotFoundError):
    """No such dataset version for this tenant (another tenant's version is just as unknown)."""

    code = "unknown_dataset"
    default_hint = "List your datasets with `trainyard datasets list`; upload one with `datasets upload`."


class ConflictError(TrainyardError):
    code = "conflict"
    http_status = 409
    exit_code = 4
    default_hint = "Reload the resource and retry the operation."


class IllegalTransitionError(ConflictError):
    code = "illegal_transition"
    default_hint = "The job is not in a state that allows this operation; see `trainyard jobs get`."


class PromotionBlockedError(ConflictError):
    """Moving ``production`` needs a passing evaluation of the version (DESIGN §3.8)."""

    code = "promotion_blocked"
    default_hint = "Run `trainyard eval run` against the current production (or the base) first."


class AuthenticationError(TrainyardError):
    code = "unauthenticated"
    http_status = 401
    exit_code = 5
    default_hint = "Set TRAINYARD_API_KEY (or run `trainyard up` once to create $TRAINYARD_HOME/api_key)."


class PermissionDeniedError(TrainyardError):
    code = "forbidden"
    http_status = 403
    exit_code = 5
    default_hint = "This operation needs an admin key."


class UserCodeNotAllowedError(PermissionDeniedError):
    """The tenant may not run its own code (``entrypoint``) until an admin allows it."""

    code = "user_code_not_allowed"
    default_hint = "Ask an admin to run `trainyard tenants update NAME --allow-user-code`."


class PayloadTooLargeError(TrainyardError):
    code = "payload_too_large"
    http_status = 413
    exit_code = 2
    default_hint = "Send a smaller request body."


class QuotaExceededError(TrainyardError):
    code = "quota_exceeded"
    http_status = 429
    exit_code = 6
    default_hint = (
        "Wait for running jobs to finish, or ask an admin to raise the quota with "
        "`trainyard tenants update TENANT --max-queued-jobs N`."
    )


class BudgetExceededError(TrainyardError):
    """A hard dollar budget would be passed; ``details`` carries the numbers (limit, spent, reserved,
    the quoted cost and which estimate it is)."""

    code = "budget_exceeded"
    http_status = 402
    exit_code = 6
    default_hint = "Ask an admin to raise the budget with `trainyard budgets set TENANT --usd N --hard`."


class RateLimitedError(TrainyardError):
    """Too many requests for a token bucket; ``retry_after_s`` says when one token is back."""

    code = "rate_limited"
    http_status = 429
    exit_code = 6
    default_hint = "Slow down: retry after the number of seconds in the Retry-After header."

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        headers: dict[str, str] | None = None,
        hint: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, hint=hint, details=details)
        self.retry_after_s = retry_after_s
        self.headers = headers or {}


class LedgerMismatchError(TrainyardError):
    """The usage ledger and the jobs' recorded costs (or the budgets' spent totals) disagree."""

    code = "ledger_mismatch"
    http_status = 500
    exit_code = 1
    default_hint = "The details list every job and budget that disagrees; this is a bug, please report it."


class InfeasibleError(TrainyardError):
    """No option satisfies the job's constraints (memory, deadline, budget, escape hatches)."""

    code = "infeasible"
    http_status = 422
    exit_code = 7
    default_hint = "Relax the deadline, budget, allowed accelerators or markets; `trainyard quote` shows why."


class ServiceUnavailableError(TrainyardError):
    code = "unavailable"
    http_status = 503
    exit_code = 8
    default_hint = "Start the platform with `trainyard up` or set TRAINYARD_URL to a running server."


class EngineUnavailableError(InvalidInputError):
    """A deployment asks for an inference engine that is not installed where its replicas run."""

    code = "engine_unavailable"
    default_hint = "Install the engine in the replicas' environment, or deploy with --engine transformers."


class PortInUseError(ServiceUnavailableError):
    """`trainyard up` cannot listen: the port is taken (often by another `trainyard up`)."""

    code = "port_in_use"
    default_hint = "See `trainyard status`, or start on another port with --port N."


class StorageError(TrainyardError):
    code = "storage_error"
    http_status = 500
    exit_code = 9
    default_hint = "Check that the checkpoint storage URL exists, is writable and has free space."


class CheckpointError(StorageError):
    code = "checkpoint_error"
    default_hint = "The checkpoint is torn or corrupted; an earlier committed step will be used."


class MissingExtraError(TrainyardError):
    """A command needs an optional part of trainyard (an install extra) that is not installed."""

    code = "missing_extra"
    http_status = 501
    exit_code = 10

    def __init__(self, extra: str, module: str, *, what: str = "this command") -> None:
        super().__init__(
            f"{what} needs the trainyard[{extra}] extra (no module named {module!r})",
            hint=f"Install it with: pip install 'trainyard[{extra}]'",
            details={"extra": extra, "module": module},
        )
        self.extra = extra
        self.module = module
