"""Planned stops: SIGINT and SIGTERM (Ctrl-C, preemption) end a training loop after the step
in progress, with a checkpoint, instead of wherever the signal lands; a second signal stops
at once. Used by ``srope train`` and ``srope synth``."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(KeyboardInterrupt):
    """A planned stop by a signal: raised after the checkpoint is written."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class StopSignals:
    """SIGINT / SIGTERM become a request that the loop honours after the step in progress;
    a second signal stops at once."""

    def __init__(self, say):
        self.signum: int | None = None
        self.say = say
        self.previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = signum
        self.say(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint (send it again to stop at once)")

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}
