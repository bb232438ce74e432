"""The SMT check (``proof.smt_check``) in a process of its own, for a run's workers.

A cold run's proofs nearly all end on the fast path: over the Debian 6.1 kernel, 202 of 40,000 reach
``check_by_smt``, and they take 10 ms together.  Importing what that check needs (claripy's operations
of angr, z3, unicorn) takes about 1.1 s, and a worker imported it on its first such proof, or the parent
before forking the workers, while the run's second core stood idle.  ``SmtHelper`` starts a process that
does that import beside the parent's own setup (functions, sites, the store) and then answers every
worker's checks; the workers never import it.

A check asked of the helper is the same call, with the same arguments, as the one a worker would make
(``proof.prove.prove_plan``'s ``smt``): its answer, or the exception it raised, comes back as it is.  The worker's
watchdog still bounds the wait (a late answer is recognised by its number and dropped), and the helper
runs each check under a watchdog of its own, so a hang there times out as it would in the worker.  A
worker that cannot reach the helper (none started, or it died) imports the check and runs it itself.
The helper listens on an abstract Unix socket (no file to clean up) and exits with the parent (the kernel
kills it when the parent dies, ``_die_with``).
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import secrets
import selectors
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..collector import paused
from ..errors import RelocverifyError
from .watchdog import ProofTimeout, own_alarm, watchdog


class SmtHelper:
    """A process that imports the SMT check and serves it, for as long as the session that started it.

    ``first``: work the process does before that import, on the second core while the parent sets up: a
    call whose value (bytes) ``first_value`` hands over (a cold kernel run: its sites, ``engine.site_memo``)."""

    def __init__(self, timeout_margin_s: float, first: Callable[[], bytes] | None = None):
        self.address = f"\0relocverify-smt-{os.getpid()}-{secrets.token_hex(8)}"
        ctx = multiprocessing.get_context("fork")
        ready, told = ctx.Pipe(duplex=False)
        self._first, first_end = ctx.Pipe(duplex=False) if first is not None else (None, None)
        self.process = ctx.Process(
            target=_serve, args=(self.address, os.getpid(), timeout_margin_s, told, first, first_end), daemon=True,
            name="relocverify-smt")
        # Forked with SIGTERM and SIGINT blocked, which the helper unblocks once it has its own handlers: a run that
        # ends at once (a busy store) and ends its helper must not meet the CLI's handler, inherited, in it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        told.close()
        if first_end is not None:
            first_end.close()
        self._ready = ready

    def first_value(self, timeout_s: float = 120.0) -> bytes | None:
        """What ``first`` returned, once it is done; None when it raised, the process died before it was done, or
        it took longer than ``timeout_s`` (the caller then does the work itself)."""
        if self._first is None:
            return None
        conn, self._first = self._first, None
        try:
            if not conn.poll(timeout_s):
                return None
            status, value = conn.recv()
        except (EOFError, OSError):
            return None
        finally:
            conn.close()
        return value if status == "ok" else None

    def wait_listening(self, timeout_s: float = 10.0) -> bool:
        """Whether the helper listens (it closes its end of a pipe once bound), waiting up to ``timeout_s``;
        forked workers then find it (a worker that does not imports the check itself)."""
        if self._ready.closed:
            return True
        try:
            if self._ready.poll(timeout_s):
                self._ready.recv()
        except EOFError:
            self._ready.close()
            return True
        return False

    def close(self) -> None:
        if not self._ready.closed:
            self._ready.close()
        if self._first is not None:
            self._first.close()
            self._first = None
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=5)


def _serve(address: str, parent: int, margin_s: float, told: Connection, first: Callable[[], bytes] | None = None,
           first_end: Connection | None = None) -> None:
    """The helper's loop: listen, do ``first`` and send its value, import the check, answer requests (number,
    arguments) with (number, ("ok", result) or ("raise", exception)); return when the parent is gone."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent ends it (``close``); not the CLI's handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the session
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # a SIGTERM held since the fork ends it now, quietly
    _die_with(parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    told.close()
    if first is not None:
        try:
            answer = ("ok", first())
        except Exception:  # noqa: BLE001 - the parent does the work itself, and meets the error there
            answer = ("raise", None)
        try:
            first_end.send(answer)
        except OSError:
            pass
        first_end.close()
    with paused():  # angr's import makes a few hundred thousand objects that live on: no full pass over them
        from ..proof.smt_check import check_by_smt  # the import this process exists for

    own_alarm()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while True:
        events = selector.select(timeout=1.0)
        if os.getppid() != parent:
            return  # the run is over (or was killed): nobody will ask again
        for key, _ in events:
            if key.fileobj is listener:
                conn, _ = listener.accept()
                client = Connection(conn.detach())
                selector.register(client, selectors.EVENT_READ)
                continue
            client = key.fileobj
            try:
                number, args = client.recv()
            except (EOFError, OSError):
                selector.unregister(client)
                client.close()
                continue
            try:
                with watchdog(args[5] / 1000 + margin_s):  # timeout_ms, as the worker's watchdog allows
                    answer = ("ok", check_by_smt(*args))
            except ProofTimeout as exc:
                answer = ("raise", exc)
            except Exception as exc:  # noqa: BLE001 - the worker raises it where it would have been raised
                answer = ("raise", exc)
            try:
                client.send((number, answer))
            except (OSError, ValueError):
                selector.unregister(client)
                client.close()


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``): the loop below
    looks for that only between requests, and a parent killed during the import (seconds on a loaded
    machine with a cold page cache) left the helper importing on.  Elsewhere the loop's check serves."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the request took hold
        os._exit(0)


_PR_SET_PDEATHSIG = 1
_HELD = frozenset({signal.SIGTERM, signal.SIGINT})  # blocked from the fork until the helper has its handlers


class HelperGone(RelocverifyError):
    """The helper cannot be reached: the check runs here."""


class SmtClient:
    """A worker's side: ``check`` sends a check to the helper and waits for its answer."""

    def __init__(self, address: str):
        self.address = address
        self.conn: Connection | None = None
        self.numbers = itertools.count(1)

    def check(self, *args):
        if self.conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.address)
            except OSError:
                sock.close()
                raise HelperGone(self.address) from None
            self.conn = Connection(sock.detach())
        number = next(self.numbers)
        try:
            self.conn.send((number, args))
            while True:
                got, (status, value) = self.conn.recv()
                if got == number:
                    break  # answers to earlier checks are dropped
        except (EOFError, OSError):
            self._drop()
            raise HelperGone(self.address) from None
        except BaseException:
            self._drop()  # the watchdog stopped a send or a receive part way: the stream is lost, not the helper
            raise
        if status == "raise":
            raise value
        return value

    def _drop(self) -> None:
        self.conn.close()
        self.conn = None


def helper_checker(address: str | None) -> Callable | None:
    """In a worker: what sends its SMT checks to the helper listening at ``address`` (``proof.prove.prove_plan``'s
    ``smt``), or None when no helper runs (``address`` None: nothing is imported, so a warm run's workers need not
    load the proof modules at all)."""
    if address is None:
        return None
    client = SmtClient(address)

    def check(*args):
        try:
            return client.check(*args)
        except HelperGone:
            from ..proof.smt_check import check_by_smt  # the helper is gone: this worker imports the check itself

            return check_by_smt(*args)
    return check
