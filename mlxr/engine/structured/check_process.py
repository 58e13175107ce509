"""Admission checks of grammars (grammar.check) in processes of their own, under one time
budget per request.

A check's steps run in llguidance with the GIL held and cannot be interrupted from Python: a
schema whose forced text is long (an array of 10,000 consts) takes seconds a step, and a forced
tool call tries such steps for every tool. In a thread, four such requests held the prompt pool
for minutes and stalled the event loop; a timeout answered the client but left the check
running. Here each check runs in a worker process, a request's checks together get
GRAMMAR_CHECK_BUDGET_S, and a check still running when the budget is spent is stopped by
killing its process (a new one starts at the next check). GRAMMAR_CHECK_PROCESSES bounds the
checks running at once; plain requests never wait for them."""
from __future__ import annotations

import asyncio
import contextvars
import json
import os
import queue
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from mlxr.engine.structured.check_worker import spec_line
from mlxr.engine.structured.grammar import PARAM, check, checked_before, mark_checked
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams

# All of one request's grammar checks together (a forced call's union, then each tool when the
# union fails, then the reply's grammar with its reasoning); env MLXR_GRAMMAR_CHECK_BUDGET_S.
GRAMMAR_CHECK_BUDGET_S = 10.0
# Checks running at once in an API process (each a process); more wait, within their budget.
GRAMMAR_CHECK_PROCESSES = 2
_WAITERS = 32  # threads that wait on the processes' answers (no GIL held while waiting)


def budget_seconds() -> float:
    raw = os.environ.get("MLXR_GRAMMAR_CHECK_BUDGET_S")
    try:
        return float(raw) if raw else GRAMMAR_CHECK_BUDGET_S
    except ValueError:
        return GRAMMAR_CHECK_BUDGET_S


class GrammarBudgetError(InvalidParameterError):
    """The request's grammar checks did not finish within its budget."""

    def __init__(self, seconds: float) -> None:
        super().__init__(PARAM, f"the request's grammar checks did not finish within {seconds:g} s "
                                f"(GRAMMAR_CHECK_BUDGET_S); simplify the schema or give fewer tools")


class CheckBudget:
    """The time left to one request's grammar checks."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = budget_seconds() if seconds is None else seconds
        self.deadline = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self) -> GrammarBudgetError:
        return GrammarBudgetError(self.seconds)


_REQUEST_BUDGET: contextvars.ContextVar[CheckBudget | None] = contextvars.ContextVar("grammar_budget", default=None)


def request_budget() -> CheckBudget:
    """The budget of the request whose task this is: made at its first check, shared by the rest."""
    budget = _REQUEST_BUDGET.get()
    if budget is None:
        budget = CheckBudget()
        _REQUEST_BUDGET.set(budget)
    return budget


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxr.engine.structured.check_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.buffer = b""

    def ask(self, line: bytes, timeout: float) -> dict | None:
        """The answer to one check, or None when none came within timeout."""
        self.proc.stdin.write(line)
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise OSError("the grammar check process exited")
            self.buffer += chunk
        answer, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(answer)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class GrammarChecks:
    """grammar.check in worker processes, each check bounded by its request's budget."""

    def __init__(self, processes: int = GRAMMAR_CHECK_PROCESSES) -> None:
        self._slots: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(processes):
            self._slots.put(None)  # started at first use

    def check(self, spec: StructuredOutputsParams, budget: CheckBudget) -> str:
        """spec's grammar text, or InvalidParameterError (GrammarBudgetError when its budget
        is spent first, the check then stopped)."""
        if checked_before(spec):
            return check(spec)  # checked before: only the text is built
        try:
            worker = self._slots.get(timeout=max(budget.left(), 0.0))
        except queue.Empty:
            raise budget.spent() from None
        try:
            if budget.left() <= 0:
                raise budget.spent()
            worker, answer = self._ask(worker or _Worker(), spec_line(spec), budget)
            if answer is None:
                worker.stop()
                worker = None
                raise budget.spent()
        finally:
            self._slots.put(worker)
        if "text" not in answer:
            raise InvalidParameterError(answer["param"], answer["message"])
        mark_checked(spec)
        return answer["text"]

    @staticmethod
    def _ask(worker: _Worker, line: bytes, budget: CheckBudget) -> tuple[_Worker, dict | None]:
        try:
            return worker, worker.ask(line, budget.left())
        except (OSError, ValueError):  # the process died (killed from outside): one more try
            worker.stop()
            worker = _Worker()
            return worker, worker.ask(line, budget.left())


_CHECKS = GrammarChecks()
_WAIT_POOL = ThreadPoolExecutor(_WAITERS, thread_name_prefix="mlxr-grammar-check")


async def check_bounded(spec: StructuredOutputsParams, budget: CheckBudget | None = None) -> str:
    """grammar.check(spec) in a worker process, within budget (the request's by default)."""
    budget = budget or request_budget()
    call = contextvars.copy_context().run
    return await asyncio.get_running_loop().run_in_executor(_WAIT_POOL, call, _CHECKS.check, spec, budget)
