"""Issue order of one kind of channel operation: answers are processed one at a time, in turn.

A process's puts are processed in the order they were issued (and its gets likewise),
whatever order their answers are handed in. Answers come from threads that must not
wait (the link's receiving thread, the thread that fails a broken link's operations):
when another thread holds the *turn* they leave the answer in an inbox and go on.

Whoever gives the turn up processes what was left meanwhile, before anyone can be left
waiting for it. That covers the holders that process no answer themselves too (a put
with a credit, the credit linger, close): an answer that arrived while one of them held
the turn would otherwise sit in the inbox until the next answer of its kind came, and
the last answer of a burst -- a put whose payload was then never sent -- until the
channel worker gave up on its payload and reset the link, which failed nothing here.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from p2p_worker._channels._client.work import Granted, Op, answer_processing

Answer = tuple[Op, Granted | None, BaseException | None]
Process = Callable[[Op, Granted | None, BaseException | None, bool], None]


class IssueOrder:
    """Processes the answers of one kind of operation in issue order; ``with`` takes the turn.

    ``process(op, answer, error, inline)`` handles one answer; ``inline`` is True for the
    answer of the op whose caller handed it in with :meth:`deliver` ``(inline=True)``.

    Example:
        >>> seen = []
        >>> order = IssueOrder(lambda op, answer, error, inline: seen.append(answer))
        >>> a, b = Op(0, "put", None, None, False), Op(1, "put", None, None, False)
        >>> order.deliver(b, "second", None, inline=False)  # waits for op 0
        >>> with order:  # the turn is held (say, by a put with a credit)
        ...     order.deliver(a, "first", None, inline=False)
        ...     seen
        []
        >>> seen, order.next
        (['first', 'second'], 2)
    """

    __slots__ = ("_answers", "_inbox", "_lock", "_process", "next")

    def __init__(self, process: Process) -> None:
        self._process = process
        self._lock = threading.Lock()
        self._inbox: deque[Answer] = deque()
        self._answers: dict[int, Answer] = {}
        self.next = 0  # the issue number (``Op.seq``) whose answer is processed next

    def deliver(
        self, op: Op, answer: Granted | None, error: BaseException | None, inline: bool
    ) -> None:
        """Hand in ``op``'s answer; process every answer that is next in line, in order.

        With ``inline`` (a caller waiting for ``op``) this waits for the turn, so ``op``
        is processed in the calling thread if its turn has come; otherwise the answer is
        left for the turn's holder when the turn is taken.
        """
        self._inbox.append((op, answer, error))
        self._drain(op if inline else None)

    def locked(self) -> bool:
        """Whether some thread holds the turn now."""
        return self._lock.locked()

    def claim(self) -> bool:
        """Take the turn if it is free now (never waits); release it with :meth:`release`."""
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        """Give the turn up, then process what was handed in while it was held."""
        self._lock.release()
        self._drain(None)

    def __enter__(self) -> IssueOrder:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _drain(self, own: Op | None) -> None:
        inbox, lock = self._inbox, self._lock
        while inbox:
            if not lock.acquire(blocking=own is not None):
                return  # the holder processes it when it lets go of the turn
            try:
                answers = self._answers
                while inbox:
                    got = inbox.popleft()
                    answers[got[0].seq] = got
                while self.next in answers:
                    ready = answers.pop(self.next)
                    self.next += 1
                    try:
                        with answer_processing():
                            self._process(*ready, own is not None and ready[0] is own)
                    except BaseException as exc:  # never leave a handle pending
                        ready[0].work._finish(exception=exc)
                    while inbox:
                        got = inbox.popleft()
                        answers[got[0].seq] = got
            finally:
                lock.release()
            own = None  # our own op is processed; later rounds only drain
