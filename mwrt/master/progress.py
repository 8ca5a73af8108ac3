"""Progress of a long wait the user started (a save, a load, many local workers starting).

Nothing is shown for the first MWRT_PROGRESS_AFTER seconds (2 by default): short waits stay
quiet. After that, tqdm's bar where tqdm is installed (it draws in terminals and notebooks
alike), else one line on a terminal's stderr, rewritten in place; nothing when stderr is
not a terminal and tqdm is absent, so logs and pipes stay clean.
"""

from __future__ import annotations

import sys
import time

from .. import config


class Progress:
    """A counter of `total` units of `what`, shown once the wait has lasted a while."""

    def __init__(self, total: float, what: str, unit: str = "B"):
        self.total, self.what, self.unit, self.done = total, what, unit, 0.0
        self.started = time.monotonic()
        self.after = config.get("progress_after")
        self._bar = None
        self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, amount: float) -> None:
        """Count `amount` more units done; show the bar if the wait has lasted long enough
        (never for a total of 0: a wait too small to report)."""
        self.done += amount
        if not self.total or (not self._shown and time.monotonic() - self.started < self.after):
            return
        self._show()

    def _show(self) -> None:
        if not self._shown:
            self._shown = True
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                scale = self.unit == "B"
                self._bar = tqdm(total=self.total, desc=self.what, unit=self.unit,
                                 unit_scale=scale, unit_divisor=1024 if scale else 1000)
        if self._bar is not None:
            self._bar.n = self.done
            self._bar.refresh()
        elif sys.stderr.isatty():
            sys.stderr.write(f"\r{self.what}: {_amount(self.done, self.unit)} of "
                             f"{_amount(self.total, self.unit)}")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._shown and sys.stderr.isatty():
            sys.stderr.write("\n")


def _amount(value: float, unit: str) -> str:
    if unit != "B":
        return f"{value:g} {unit}"
    for prefix in ("", "Ki", "Mi", "Gi"):
        if value < 1024 or prefix == "Gi":
            return f"{value:.1f} {prefix}B"
        value /= 1024
    return f"{value:.1f} B"
