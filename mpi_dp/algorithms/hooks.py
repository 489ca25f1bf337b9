"""What the runner hands one configuration's run: where its records, progress lines and
checkpoints go (`RunHooks`), so that an algorithm's loop reads `hooks.record(k, values)`,
`hooks.progress(k)` and `hooks.checkpoint(state)` instead of building its own closures.

The runner (`runner._run_one`) builds one per configuration on every rank: the recorder is the
configuration's `results.recorder.ConfigRecorder` on rank 0 and None elsewhere (and None in tests
that run an algorithm without a result file); the progress lines are rank 0's. Everything here is
bookkeeping: nothing reads or changes a model, a noise stream or a ledger, so a run with hooks
gives bitwise what it gives without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import progress as prog
from ..comm import stop


class RunHooks:
    """Recording, progress and checkpoints of one configuration.

    `recorder`: the configuration's recorder (rank 0 of a runner job) or None; `label`: the
    configuration's name in progress lines (`'3/8 eps=1 ...'`); `comm`: the communicator of the
    collective `at_record` / `checkpoint` (an algorithm may pass its own, e.g. a graph's);
    `progress`: whether progress lines are wanted; they are written on rank 0 of `comm` only
    (every rank when `comm` is None). `total` and `unit` name the loop of `progress(k)`
    (`start` sets them when the algorithm knows its horizon).
    """

    def __init__(self, recorder: Any = None, label: str = "", comm: Any = None,
                 progress: bool = True, total: int = 0, unit: str = "iteration") -> None:
        self.recorder, self.label, self.comm = recorder, label, comm
        self.reports = bool(progress) and (comm is None or comm.Get_rank() == 0)
        self.bar = prog.Progress(label, total, unit, enabled=self.reports)

    @classmethod
    def of(cls, hooks: RunHooks | None, recorder: Any = None, label: str = "",
           comm: Any = None, progress: bool = True) -> RunHooks:
        """`hooks`, or hooks built from the separate arguments an algorithm's `run_config`
        still accepts (tests, scripts and the methods that do not pass hooks yet)."""
        return hooks if hooks is not None else cls(recorder, label, comm, progress)

    # -- progress -----------------------------------------------------------------------------
    def start(self, total: int, unit: str = "iteration") -> prog.Progress:
        """Start the progress of a loop of `total` steps counted in `unit` (its clock starts
        now); returns its `progress.Progress` (`bar`)."""
        self.bar = prog.Progress(self.label, total, unit, enabled=self.reports)
        return self.bar

    def progress(self, k: int, detail: str | Callable[[], str] = "") -> bool:
        """Step k of the loop: a progress line when one is due (`progress.Progress.update`;
        `detail`: text, or a function called only when a line is written)."""
        return self.bar.update(k, detail)

    def info(self, text: str) -> None:
        """A one-off line `[label] text` on the reporting rank (e.g. where a run resumed)."""
        if self.reports:
            prog.info(f"[{self.label}] {text}")

    # -- records ------------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        """Whether records go anywhere on this rank (a recorder is attached)."""
        return self.recorder is not None

    def attrs(self, **values: Any) -> None:
        """Set attributes of the configuration's group (what the run derives from its contract,
        e.g. a per-iteration eps) when there is a recorder."""
        if self.recorder is not None:
            self.recorder.set_attrs(**values)

    def record(self, k: int, values: dict[str, Any]) -> None:
        """Append the record of step k (metric name -> value) when there is a recorder."""
        if self.recorder is not None:
            self.recorder.append(k, values)

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint_due(self) -> bool:
        """Whether the recorder's clock asks for a checkpoint now (False without a recorder):
        the learner's (rank 0's) view, which `at_record` shares with every rank."""
        return self.recorder is not None and self.recorder.checkpoint_due()

    def saved_state(self) -> Any:
        """The checkpoint a resumed configuration continues from (None: start afresh; always
        None without a recorder)."""
        return self.recorder.saved_state() if self.recorder is not None else None

    def save_state(self, state: Any) -> None:
        """Store a checkpoint (`state`, picklable) when there is a recorder."""
        if self.recorder is not None:
            self.recorder.save_state(state)

    def at_record(self, comm: Any = None) -> tuple[bool, int]:
        """Collective over `comm` (default: the hooks' communicator), at a record: (save a
        checkpoint now, the signal to stop on or 0), `comm.stop.at_record` with this rank's
        `checkpoint_due`: rank 0's clock decides, a stop asked on any rank saves and stops
        all."""
        return stop.at_record(comm if comm is not None else self.comm, self.checkpoint_due())

    def checkpoint(self, state: Callable[[], Any], comm: Any = None) -> None:
        """Collective, at a record: `at_record`; when it says save, `state()` is called on every
        rank (it may be collective) and what it returns on a rank with a recorder is stored
        (None: nothing to store there); after a stop's checkpoint every rank raises
        `comm.stop.Interrupted`."""
        save, signum = self.at_record(comm)
        if save:
            st = state()
            if st is not None:
                self.save_state(st)
        if signum:
            raise stop.Interrupted(signum)
