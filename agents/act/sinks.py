"""How ``flopwatch act`` acts on one trigger: print it, POST it to a webhook or run kubectl."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TextIO

from agents.act.commands import UnsafeName, dry_run_line, kubectl_args, shown
from agents.act.ledger import Mode
from agents.runtime.backoff import Backoff
from agents.runtime.logs import redact
from schemas.triggers import Trigger

log = logging.getLogger("flopwatch.act")

S = 1_000_000_000
Outcome = Literal["printed", "posted", "executed", "refused", "failed"]


@dataclass(frozen=True, slots=True)
class Result:
    """What acting on one trigger came to; what the ledger records with its key."""

    outcome: Outcome
    detail: str = ""


class Sink(Protocol):
    """Where triggers are acted on. ``act`` returns None only when ``stop`` was set before an answer."""

    mode: Mode
    name: str

    async def open(self) -> None: ...

    async def act(self, t: Trigger, body: bytes, stop: asyncio.Event) -> Result | None: ...

    async def close(self) -> None: ...


class DryRunSink:
    """Prints the command each trigger asks for."""

    mode: Mode = "dry-run"
    name = "dry run"

    def __init__(self, out: TextIO | None = None, kubectl: str = "kubectl") -> None:
        self._out = out
        self._kubectl = kubectl

    async def open(self) -> None:
        pass

    async def act(self, t: Trigger, body: bytes, stop: asyncio.Event) -> Result | None:
        try:
            line = dry_run_line(t, self._kubectl)
        except UnsafeName as exc:
            return Result("refused", str(exc))
        out = self._out or sys.stdout
        out.write(line + "\n")
        out.flush()  # printed is what the ledger will say: it must not sit in a buffer a crash loses
        return Result("printed")

    async def close(self) -> None:
        pass


def retryable(status: int | None) -> bool:
    """No answer, a server error, or a 4xx that means "later": worth sending the same request again.

    >>> [retryable(s) for s in (None, 500, 503, 408, 429, 400, 404, 409, 301)]
    [True, True, True, True, True, False, False, False, False]
    """
    return status is None or status >= 500 or status in (408, 425, 429)


def header_safe(text: str) -> bool:
    """Whether ``text`` can be an HTTP header value as it is (visible ASCII and spaces, no line breaks)."""
    return bool(text) and all(" " <= ch <= "~" for ch in text)


class WebhookSink:
    """POSTs each trigger with ``Idempotency-Key`` until the receiver answers 2xx (or refuses it for good)."""

    mode: Mode = "live"

    def __init__(self, url: str, timeout_s: float = 10.0, backoff_min_s: float = 0.5,
                 backoff_max_s: float = 30.0) -> None:
        self._url = url
        self.name = f"webhook {redact(url)}"
        self._timeout_s = timeout_s
        self._backoff_ns = (int(backoff_min_s * S), int(backoff_max_s * S))
        self._http: Any = None

    async def open(self) -> None:
        import aiohttp

        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))

    async def act(self, t: Trigger, body: bytes, stop: asyncio.Event) -> Result | None:
        if not header_safe(t.idempotency_key):
            return Result("refused", f"idempotency key {shown(t.idempotency_key)} cannot be sent as an HTTP header")
        backoff = Backoff(*self._backoff_ns)
        attempts = 0
        while not stop.is_set():
            attempts += 1
            status, detail = await self._post(t.idempotency_key, body)
            if status is not None and 200 <= status < 300:
                if backoff.failures:
                    log.info("the webhook took %s after %d attempts", shown(t.idempotency_key), attempts)
                return Result("posted", f"HTTP {status} after {attempts} attempt(s)")
            answer = detail if status is None else f"HTTP {status}: {detail}"
            if not retryable(status):
                return Result("refused", f"{self.name} answered {answer}")
            delay_ns = backoff.failed(now_ns=0)  # counted from 0, the retry time is the delay
            if backoff.failures == 1 or backoff.failures % 10 == 0:
                log.warning("%s did not take %s (%s; attempt %d); retrying in %.1f s, the key is not marked done",
                            self.name, shown(t.idempotency_key), answer, attempts, delay_ns / S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_ns / S)
        return None

    async def _post(self, key: str, body: bytes) -> tuple[int | None, str]:
        import aiohttp

        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        try:
            # No redirects: a POST that is redirected may become a GET, or go somewhere not configured.
            async with self._http.post(self._url, data=body, headers=headers, allow_redirects=False) as resp:
                text = "" if 200 <= resp.status < 300 else (await resp.text(errors="replace"))[:300].strip()
                return resp.status, text
        except (aiohttp.ClientError, TimeoutError) as exc:
            return None, f"{type(exc).__name__}: {exc}"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


class KubectlSink:
    """Runs kubectl (an argument list, never a shell) for each trigger."""

    mode: Mode = "live"

    def __init__(self, kubectl: str = "kubectl", timeout_s: float = 60.0, attempts: int = 5,
                 backoff_min_s: float = 1.0, backoff_max_s: float = 30.0) -> None:
        self._kubectl = kubectl
        self.name = f"exec {kubectl}"
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._backoff_ns = (int(backoff_min_s * S), int(backoff_max_s * S))

    async def open(self) -> None:
        found = shutil.which(self._kubectl)
        if found is None:
            raise RuntimeError(f"{self._kubectl!r} is not an executable on PATH; --exec needs kubectl "
                               "(or --kubectl PATH)")
        self._kubectl = found

    async def act(self, t: Trigger, body: bytes, stop: asyncio.Event) -> Result | None:
        try:
            args = kubectl_args(t)
        except UnsafeName as exc:
            return Result("refused", str(exc))
        backoff = Backoff(*self._backoff_ns)
        detail = ""
        for attempt in range(1, self._attempts + 1):
            rc, detail = await self._run(args)
            if rc == 0:
                return Result("executed", detail or f"exit 0 after {attempt} attempt(s)")
            if attempt == self._attempts:
                break
            delay_ns = backoff.failed(now_ns=0)  # counted from 0, the retry time is the delay
            log.warning("kubectl %s failed (%s; attempt %d of %d); retrying in %.1f s", " ".join(args), detail,
                        attempt, self._attempts, delay_ns / S)
            try:
                await asyncio.wait_for(stop.wait(), delay_ns / S)
                return None  # stopping: not recorded, so the next start tries again
            except TimeoutError:
                pass
        return Result("failed", f"kubectl {' '.join(args)}: {detail} ({self._attempts} attempts)")

    async def _run(self, args: list[str]) -> tuple[int | None, str]:
        # Not interrupted by a stop: once kubectl runs, its result is what gets recorded.
        proc = await asyncio.create_subprocess_exec(self._kubectl, *args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None, f"no answer in {self._timeout_s:.0f} s"
        if proc.returncode == 0:
            return 0, out.decode(errors="replace").strip()[-300:]
        return proc.returncode, f"exit {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}"

    async def close(self) -> None:
        pass
