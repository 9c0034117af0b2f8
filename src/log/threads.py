"""The two ways the store's threads meet: a worker thread fed work under a condition, and event
loops' waiters woken from another thread.

``Worker`` is the loop of the writer thread (group commit), and, as ``Requests``, of the
checkpoint thread and the fold thread of user projections: a daemon thread started on the first ``wake``, taking its work under
the condition the producers signal, running it outside that lock, and ending once told it is done.
``Waiters`` are the futures of tasks on any event loops waiting for something another thread does
(a commit a follower waits for, a fold a projection reader waits for): ``wake`` resolves each on
its own loop, from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Worker(Generic[T]):
    """A daemon thread that runs work as producers hand it over, one piece at a time.

    Under ``condition``, the thread ends once ``done()`` says so, else runs what ``take()``
    returns (``None``: nothing yet, it waits for a ``wake``); ``run`` is called outside the lock.
    ``done`` is asked first, so work handed over after the stop is left for the closer."""

    def __init__(
        self,
        name: str,
        condition: threading.Condition,
        take: Callable[[], T | None],
        run: Callable[[T], None],
        done: Callable[[], bool],
    ) -> None:
        self.name = name
        self.condition = condition
        self._take, self._run, self._done = take, run, done
        self.thread: threading.Thread | None = None

    def wake(self) -> None:
        """With ``condition`` held: there is work (or the stop): start the thread the first
        time, else wake it."""

        if self.thread is None:
            self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self.thread.start()
        self.condition.notify()

    def join(self) -> None:
        """Wait for the thread to end (after ``done()`` became true and it was woken)."""

        if self.thread is not None:
            self.thread.join()

    def _main(self) -> None:
        condition, take, done = self.condition, self._take, self._done
        while True:
            with condition:
                while True:
                    if done():
                        return
                    work = take()
                    if work is not None:
                        break
                    condition.wait()
            self._run(work)


class Requests(Worker[bool]):
    """A ``Worker`` whose work is one flag: ``want`` asks for a run of ``run``; requests made
    while it runs come to one more run after it (a checkpoint, a round of folds)."""

    def __init__(
        self,
        name: str,
        condition: threading.Condition,
        run: Callable[[], None],
        done: Callable[[], bool],
    ) -> None:
        super().__init__(name, condition, self._take_wanted, lambda _: run(), done)
        self.wanted = False
        """A run was asked for and has not begun (read without the lock as a hint only)."""

    def want(self) -> None:
        """With ``condition`` held: ask for a run (starting the thread the first time)."""

        self.wanted = True
        self.wake()

    def _take_wanted(self) -> bool | None:
        if not self.wanted:
            return None
        self.wanted = False
        return True


class Waiters:
    """Futures of tasks on any event loops, each waiting to be woken by another thread."""

    def __init__(self) -> None:
        self._futures: set[asyncio.Future[None]] = set()
        self._lock = threading.Lock()

    def add(self) -> asyncio.Future[None]:
        """A new waiter on the running loop; ``wake`` resolves it (await it, shielded if the
        wait may be cancelled, and ``discard`` it after)."""

        waiter = asyncio.get_running_loop().create_future()
        with self._lock:
            self._futures.add(waiter)
        return waiter

    def discard(self, waiter: asyncio.Future[None]) -> None:
        with self._lock:
            self._futures.discard(waiter)

    def wake(self) -> None:
        """Resolve every waiter so far, each on its own loop, from any thread; a waiter whose
        loop is closed is left (nobody awaits it any more)."""

        if not self._futures:
            return  # nobody waits (one added meanwhile checks its condition after adding)
        with self._lock:
            waiters, self._futures = self._futures, set()
        for waiter in waiters:
            loop = waiter.get_loop()
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the loop closed meanwhile: nobody awaits there
                pass


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


__all__ = [
    "Requests",
    "Waiters",
    "Worker",
]
