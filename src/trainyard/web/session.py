"""Browser sessions for the dashboard.

The login form takes an API key, checks it with the tenant service and, when it is valid, opens a
server-side session: a random token (the cookie's only content, HttpOnly, SameSite=Strict) mapped to the
principal behind the key. The key itself is neither stored nor logged; only its principal is kept, for a
limited time. Sessions live in memory, so a restart logs everyone out.

Each session also carries a CSRF token: every form and every ``fetch`` that changes something sends it
back (a hidden ``csrf`` field or an ``X-CSRF-Token`` header), and the server compares it in constant time
with the session's own, so a page of another site cannot act for a logged-in user even where the
browser ignores ``SameSite``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from trainyard.services.domain import Principal

COOKIE_NAME = "trainyard_session"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Session:
    token: str
    principal: Principal
    expires_at_s: float
    csrf: str = ""

    def csrf_ok(self, value: str | None) -> bool:
        """Whether ``value`` is this session's CSRF token (compared in constant time)."""
        return bool(value) and bool(self.csrf) and secrets.compare_digest(str(value), self.csrf)


class SessionStore:
    def __init__(
        self,
        ttl_s: float = SESSION_TTL_S,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, principal: Principal) -> Session:
        sess = Session(
            secrets.token_urlsafe(32), principal, self.clock() + self.ttl_s, csrf=secrets.token_urlsafe(32)
        )
        with self._lock:
            self._sessions[sess.token] = sess
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)  # the oldest session goes first
        return sess

    def get(self, token: str | None) -> Session | None:
        if not token or len(token) > 100:
            return None
        with self._lock:
            sess = self._sessions.get(token)
            if sess is None:
                return None
            if sess.expires_at_s <= self.clock():
                del self._sessions[token]
                return None
            return sess

    def close(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._sessions.pop(token, None)

    def __len__(self) -> int:
        return len(self._sessions)
