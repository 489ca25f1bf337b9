"""`mpi-dp` command line: argument parsing only; every command calls into the layers below."""

from __future__ import annotations

import os

# One BLAS thread per rank (standard under MPI, and needed for bitwise rank-invariance).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from . import __version__  # noqa: E402
from .errors import MpiDpError  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .analysis.export import ReleaseReport

DESCRIPTION = """\
mpi_dp: differentially private learning across many data owners on MPI, results in HDF5.

Typical session:
  mpi-dp data synth --task regression --agents 3 --records 5000 --dim 10 --out data/x.h5
  mpi-dp data fetch mnist && mpi-dp data prepare mnist        # real data -> data/mnist.h5
  mpi-dp data prepare lending --source ../shared/data
  mpiexec -n 4 mpi-dp run jobs/demo.toml --set data=data/x.h5
  mpi-dp analyze results/demo.h5
  mpi-dp plot results/demo.h5
  mpi-dp compare results/demo.h5 results/sync_fig3_eps.h5   # files of any method, one table
  mpi-dp export results/demo.h5    # tidy tables for pandas: results/demo.csv, demo.ledger.csv
  mpi-dp export results/demo.h5 --release    # results/demo.release.h5, safe to share
  mpiexec -n 4 mpi-dp run jobs/demo.toml --overwrite     # replace results/demo.h5
  mpiexec -n 4 mpi-dp run jobs/demo.toml --resume        # continue a killed run
  mpi-dp merge results/demo.h5     # combine results/demo.task*.h5 of slurm/sweep.sbatch
  mpiexec -n 4 mpi-dp audit jobs/audit_sync_star.toml    # measure eps empirically
  mpi-dp forecast fit results/async_fig45_grid.h5
  mpi-dp forecast predict --fit results/async_fig45_grid.forecast.json --n 10000 --eps 1 --owners 8
"""

RUN_EPILOG = """\
The job file is TOML. Keys (per-owner keys take a scalar or one value per owner):
{keys}

Examples:
  mpiexec -n 4 mpi-dp run jobs/demo.toml
  mpiexec -n 4 python -m mpi_dp run jobs/demo.toml --set runs=5 --set 'sweep.eps=[1, 10]'
  mpi-dp run jobs/demo.toml --set step.alpha=0.5 --out /tmp/a.h5      # one rank works too

Rank 0 is the learner; owners are split in blocks over the other ranks. Results are bitwise
identical for any number of ranks. The result file is written as the run goes: if the run is
stopped, the iterations done so far stay readable.

Before the first iteration a run prints its estimated result size, memory and time (the noise
calibration included: minutes at T = 1e6); it refuses a job past the node's memory, and past
the free disk space or a month unless --force. SIGTERM or Ctrl-C stops every rank at its next
record after a checkpoint (status 'interrupted', exit 143 / 130), or within a second during the
noise calibration (which prints progress every 5 s); --resume continues it. A calibrated plan
is kept for later jobs, which read the same noise without searching ($MPI_DP_CALIBRATION_CACHE,
default $MPI_DP_CACHE/calibration or ~/.cache/mpi_dp/calibration; 'off' disables it). A rank still
running 45 s (MPI_DP_STOP_GRACE_S) after the signal aborts the job: a frozen rank cannot hold
it. A full disk stops with the complete configurations readable (exit 2); free space and
--resume. Exit status: 0 done, 2 a mistake in the job or data (one line; MPI_DP_TRACEBACK=1
adds the traceback), 1 a bug in mpi_dp (its traceback, tagged with the rank), 143 / 130
interrupted.

Splitting a sweep: --configs A:B or --config-block I/N runs one block of the configurations into
a part file (each configuration at its own index /configs/00A...); `mpi-dp merge OUT PARTS...`
combines the parts into the file the whole job writes (the same datasets, bit for bit):
  mpi-dp run jobs/demo.toml --config-block 0/2 --task-file    # -> results/demo.task0.h5
  mpi-dp run jobs/demo.toml --config-block 1/2 --task-file    # -> results/demo.task1.h5
  mpi-dp merge results/demo.h5                                # reads results/demo.task*.h5
On Slurm: sbatch --array=0-3 slurm/sweep.sbatch jobs/demo.toml [run options], then merge.
"""


#: how to continue a stopped job (printed with the interruption)
RESUME_HINT = ("continue it with the same command and --resume (complete configurations are "
               "kept, the stopped one continues from its last checkpoint)")


class _EarlyStop:
    """SIGTERM / SIGINT caught from the start of a collective command, before MPI starts and the
    numerical libraries load (seconds on a busy node: Slurm's time-limit warning can come then),
    and handed to comm.stop once it is installed: the job then stops before its first
    configuration, with the result file saying 'interrupted', instead of dying by the signal."""

    def __init__(self) -> None:
        import signal

        self.signum = 0

        def catch(signum: int, frame: object) -> None:
            self.signum = self.signum or signum
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, catch)

    def hand_over(self, stop) -> None:
        if self.signum:
            stop.request(self.signum)


#: the start-up catcher of the collective command being run (main installs it first thing)
_EARLY: _EarlyStop | None = None
#: the commands that run under mpiexec and stop at a record on SIGTERM / SIGINT
COLLECTIVE = ("run", "audit")


def _under_mpi(fn) -> int:
    """`_run_under_mpi`, then a garbage collection while mpi_dp's handlers are in place: HDF5
    objects left in reference cycles by a failed run (a full disk) are closed now, where
    output.quiet_full_disk_deallocs keeps their expected errors quiet, not at interpreter exit,
    where Python prints them as tracebacks."""
    try:
        return _run_under_mpi(fn)
    finally:
        gc.collect()


def _run_under_mpi(fn) -> int:
    """Run a collective command: agreed user errors print once; a first SIGTERM/SIGINT (Slurm's
    warning, mpiexec passing on a kill, Ctrl-C) stops every rank at its next record with the
    result file saying 'interrupted' (exit 143 / 130), and a rank that never answers cannot
    hold the others (comm.watchdog aborts the job); a rank that raises stops every rank,
    never a hang: a user error (MpiDpError) in one line, anything else is a bug and prints its
    rank-tagged traceback."""
    global _EARLY
    early, _EARLY = _EARLY or _EarlyStop(), None  # a signal during the start-up stops cleanly too
    from mpi4py import MPI

    from .comm import stop, watchdog
    from .runner import AgreedError

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    stop.install()
    early.hand_over(stop)
    try:
        grace = watchdog.grace_s()
    except MpiDpError as e:  # the same environment on every rank: each stops, rank 0 says why
        if rank == 0:
            print(f"mpi-dp: error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        with watchdog.Watchdog(comm, grace, RESUME_HINT):  # a frozen rank cannot hold the job
            fn(comm)
    except AgreedError as e:
        # raised on every rank alike (the checks are collective): one message, from rank 0
        if rank == 0:
            print(f"mpi-dp: error: {e}", file=sys.stderr, flush=True)
            _traceback_if_asked(rank, size)
        return 2
    except stop.Interrupted as e:  # every rank stopped together: no abort needed
        if rank == 0:
            where = f" {e.where}" if e.where else ""
            print(f"mpi-dp: interrupted ({e}){where}; {RESUME_HINT}", file=sys.stderr,
                  flush=True)
        return e.exit_status
    except KeyboardInterrupt:  # a second signal: at once, wherever each rank was
        if rank == 0:
            print(f"mpi-dp: interrupted at once; the result file keeps what was recorded; "
                  f"{RESUME_HINT}", file=sys.stderr, flush=True)
        if size > 1:
            if rank != 0:
                time.sleep(2.0)  # let the learner close the result file before the abort
            comm.Abort(stop.EXIT_INT)
        return stop.EXIT_INT
    except MpiDpError as e:  # a user error found by one rank during the computation
        where = f" on rank {rank}" if size > 1 else ""
        print(f"mpi-dp: error{where}: {e}", file=sys.stderr, flush=True)
        _traceback_if_asked(rank, size)
        return _abort(comm, 2)
    except BaseException as e:  # a bug: its traceback, tagged with the rank, then stop all
        where = f" on rank {rank}" if size > 1 else ""
        print(f"mpi-dp: internal error{where}: {type(e).__name__}: {e}\n"
              f"{_tagged_traceback(rank, size)}"
              "mpi-dp: this is a bug in mpi_dp, not in your job: please report it with the "
              "traceback above", file=sys.stderr, flush=True)
        return _abort(comm, 1)
    return 0


def _tagged_traceback(rank: int, size: int) -> str:
    """The current exception's traceback, each line tagged with the rank under MPI."""
    tag = f"[rank {rank}] " if size > 1 else ""
    return "".join(f"{tag}{line}\n" for line in traceback.format_exc().rstrip().splitlines())


def _traceback_if_asked(rank: int, size: int) -> None:
    """MPI_DP_TRACEBACK=1: a user error's traceback too (debugging mpi_dp itself)."""
    if os.environ.get("MPI_DP_TRACEBACK"):
        print(_tagged_traceback(rank, size), end="", file=sys.stderr, flush=True)


def _abort(comm, status: int) -> int:
    """Stop every rank of a multi-rank job from the one that failed (the others may wait in a
    collective), after mpiexec had the time to forward the message."""
    if comm.Get_size() > 1:
        sys.stderr.flush()
        time.sleep(0.5)
        comm.Abort(status)
    return status


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_job

    return _under_mpi(lambda comm: run_job(args.job, args.set or [], args.out, comm=comm,
                                           progress=not args.quiet, overwrite=args.overwrite,
                                           resume=args.resume or False,
                                           configs=args.configs or args.config_block,
                                           task_file=args.task_file, force=args.force))


def _cmd_merge(args: argparse.Namespace) -> int:
    from .results.merge import merge_parts

    merge_parts(args.out, args.parts, overwrite=args.overwrite, progress=not args.quiet)
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from .audit import run_audit

    def go(comm) -> None:
        path = run_audit(args.job, args.set or [], args.out, canary=args.canary,
                         owner=args.owner, runs=args.runs, release=args.release, comm=comm,
                         progress=not args.quiet, shape=args.shape)
        if comm.Get_rank() == 0:
            from .analysis.audit_report import audit_text

            print(audit_text(path))
            print(f"audit result: {path}  (mpi-dp analyze / mpi-dp plot it)")

    return _under_mpi(go)


def _cmd_synth(args: argparse.Namespace) -> int:
    from .data.synth import run_synth_command

    run_synth_command(args)
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .data.prepare_cli import run_prepare_command

    return run_prepare_command(args)


def _cmd_fetch(args: argparse.Namespace) -> int:
    from .data.fetch import run_fetch_command

    return int(run_fetch_command(args) or 0)


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from .data.upgrade_cli import run_upgrade_command

    return run_upgrade_command(args)


def _method_of(res):
    from .methods import REGISTRY

    return REGISTRY.get(res.algorithm)


def owners_text(res, k: int = 20) -> str:
    """'owners by race: 0 = "Black", 1 = "White", ...' for a shard partitioned by a key column."""
    named = res.owner_names()
    if named is None:
        return ""
    key, values = named
    shown = ", ".join(f"{i} = {v!r}" for i, v in enumerate(values[:k]))
    more = f", ... ({len(values)} owners)" if len(values) > k else ""
    return f"owners by {key or 'key'}: {shown}{more}"


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis import audit_report, load, privacy_text, result_checks, table

    if audit_report.is_audit(args.result):
        print(audit_report.audit_text(args.result))
        return 0
    with load.open_result(args.result) as res:
        method = _method_of(res)
        note = _completeness_note(res)
        for line in (result_checks.leftovers_note(res), result_checks.data_note(res)):
            if line:
                print(f"mpi-dp: {line}", file=sys.stderr, flush=True)
        with _incomplete_guard(res, note):
            print(method.analyze(res, args.metric))
            owners = owners_text(res)
            if owners:
                print(f"\n{owners}")
            print()
            print(privacy_text.ledger_text(res))
            if args.csv:
                table.rows_to_csv(method.table_rows(res, args.metric), args.csv)
                print(f"wrote {args.csv}")
        if note:
            print(f"\n{note}")
    print(f"\n{SHARING_NOTE.format(path=args.result)}")
    return 0


#: the last line of `mpi-dp analyze`: who may see a raw result file
SHARING_NOTE = ("sharing: {path} holds evaluation-only values computed from private records "
                "without noise; it is not safe to share outside the data owners. "
                "`mpi-dp export --release {path}` makes a shareable file.")


def _cmd_export(args: argparse.Namespace) -> int:
    from .analysis import export

    if args.release:
        if args.format:
            raise export.ExportError("--format names the tables' format; --release writes an "
                                     "HDF5 file (drop --format)")
        path, report = export.export_release(args.result, args.out, overwrite=args.overwrite,
                                             force=args.force,
                                             include_nonprivate=args.include_nonprivate)
        print(f"release: {path}  (removed {len(report.evaluation_only)} evaluation-only "
              f"dataset(s) and {len(report.attrs)} attribute(s); see its release_note)")
        _print_nonprivate(path, report)
        return 0
    if args.force or args.include_nonprivate:
        flag = "--force" if args.force else "--include-nonprivate"
        raise export.ExportError(f"{flag} applies to --release only")
    from .analysis import load

    with load.open_result(args.result) as res:
        _completeness_note(res)
    metrics, ledger = export.export_tables(args.result, args.out, args.format,
                                           overwrite=args.overwrite)
    print(f"metrics: {metrics}")
    print(f"ledger:  {ledger}")
    return 0


def _print_nonprivate(path: Path, report: ReleaseReport) -> None:
    """Which configurations a release left out for want of a finite, certified DP guarantee
    (stdout), or with --include-nonprivate the warning that it holds them (stderr)."""
    if not report.nonprivate:
        return
    n = len(report.nonprivate)
    lines = [f"  {c.line}" for c in report.nonprivate]
    if report.included:
        print(f"mpi-dp: WARNING: {path} contains the models of {n} configuration(s) without a "
              "finite, certified DP guarantee (--include-nonprivate): it is not a DP release "
              "of them; its root attribute release_warning says so:", *lines, sep="\n",
              file=sys.stderr, flush=True)
        return
    left = sum(len(c.left_out) for c in report.nonprivate)
    print(f"left out: {n} configuration(s) without a finite, certified DP guarantee: their "
          f"models and values ({left} dataset(s)); their attributes and ledger stay "
          "(release_nonprivate; --include-nonprivate keeps them):", *lines, sep="\n")


def _completeness_note(res) -> str | None:
    """Say first (on stderr) when a result is not complete: a reader must not mistake it."""
    note = res.completeness
    if note:
        print(f"mpi-dp: {note}", file=sys.stderr, flush=True)
    return note


@contextlib.contextmanager
def _incomplete_guard(res, note: str | None):
    """A result that stopped early may lack what a table or figure needs: say so, no traceback."""
    try:
        yield
    except (KeyError, IndexError, ValueError) as e:
        if note is None:
            raise
        from .analysis.load import ResultFileError

        raise ResultFileError(f"{res.path} holds too little to show ({note}; missing: "
                              f"{e.args[0] if e.args else e})") from None


def _cmd_plot(args: argparse.Namespace) -> int:
    from .analysis import load

    prefix = Path(args.out or str(Path(args.result).with_suffix("")))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    from .analysis import audit_report

    if audit_report.is_audit(args.result):
        for p in audit_report.plot_audit(args.result, prefix):
            print(p)
        return 0
    with load.open_result(args.result) as res:
        with _incomplete_guard(res, _completeness_note(res)):
            paths = _method_of(res).figures(res, prefix, args.metric)
    for p in paths:
        print(p)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import run_compare

    text, figure = run_compare(args.results, args.out, args.metric, args.overwrite)
    print(text)
    print(f"\nfigure: {figure}")
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    from .analysis.forecast_cli import run_forecast_command

    return int(run_forecast_command(args) or 0)


def _cmd_info(args: argparse.Namespace) -> int:
    from .results.provenance import versions

    v = versions()
    width = max(map(len, v))
    for k, val in v.items():
        print(f"{k:<{width}}  {val}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be computed when help is shown (`epilog_fn`), so that
    listing every method's job keys (which imports the methods, and MPI) costs nothing otherwise."""

    epilog_fn: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()


def _run_epilog() -> str:
    from .job import describe_keys

    return RUN_EPILOG.format(keys=describe_keys())


def _verbosity_arguments(parser: argparse.ArgumentParser,
                         quiet_help: str = "no progress messages (warnings only)") -> None:
    """--quiet and -v/--verbose of a long command (mpi_dp.progress.configure's levels)."""
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("--quiet", action="store_true", help=quiet_help)
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="also debug lines (e.g. per-record timings)")


def _verbosity(args: argparse.Namespace) -> int:
    """-1 for --quiet, 1 for -v, 0 otherwise (commands without them: 0)."""
    if getattr(args, "quiet", False):
        return -1
    return 1 if getattr(args, "verbose", False) else 0


EXPORT_DESCRIPTION = """\
Export a result file for other tools, or make a release that may be shared.

Tables (default; CSV, or Parquet with --format parquet, which needs pyarrow):
  RESULT.csv         the metrics: one row per (configuration, iteration, run). Columns:
                     config (the configuration's index), the configuration's columns (its swept
                     values such as eps, then its scalar attributes: label, T, runs, variant,
                     ...; array attributes such as per-owner eps and n are left out), iteration,
                     run (the run id), then one column per metric (psi, test_error, ...); a
                     per-iteration metric (step_size ...) repeats over the runs
  RESULT.ledger.csv  the privacy ledger: one row per (configuration, agent), the configuration's
                     columns, then every ledger field (mechanism, releases, eps_per_release,
                     target_eps, eps_pld, ...)
  A configuration column whose name is also a metric's or a ledger field's is named
  config.<name> (e.g. config.calibration). CSV floats are written so that pandas reads back the
  same float64 values (NaN: an empty cell). --out names the metrics table; the ledger goes
  beside it as <stem>.ledger.<ext>. Existing files are replaced only with --overwrite.

Release (--release): RESULT.release.h5, the part of the result the privacy guarantee covers.
  A raw result file holds evaluation-only values computed from private records without noise
  (metrics measured on the owners' records, reference optima and baselines): it is not safe to
  share outside the data owners. The release keeps the root attributes (job, job_resolved,
  sweep, algorithm, variant, status, format ...), the provenance, each configuration's
  attributes except those its attribute evaluation_only_attrs lists, and only the datasets
  whose attribute evaluation_only is false (a dataset without that attribute is left out);
  dimension scales stay attached. Its root says release = true, release_note (what was
  removed and why) and release_removed (the removed names). A result whose status is not
  complete is refused unless --force.
  A configuration without a finite, certified DP guarantee (trained without noise: eps = inf;
  uncertified noise or noise calibrated from private data; no privacy ledger) is left out: of
  it the release keeps only its attributes and what states its guarantee (privacy/ledger,
  ledger/*, eps, agent), never its models (models/final, models/theta ...) or any other value.
  The command lists those configurations and why; the root attribute release_nonprivate (JSON)
  does too. --include-nonprivate keeps them as they are: the command prints a warning and the
  file's root attribute release_warning says that it holds models without a DP guarantee.
"""

EXPORT_EPILOG = """\
Examples:
  mpi-dp export results/demo.h5                  # results/demo.csv, results/demo.ledger.csv
  mpi-dp export results/demo.h5 --format parquet --out tables/demo.parquet
  mpi-dp export results/demo.h5 --release       # results/demo.release.h5 (no eps = inf models)
  mpi-dp export results/demo.h5 --release --include-nonprivate --out demo.all.h5  # with them

In pandas:
  import pandas as pd
  m = pd.read_csv("results/demo.csv")            # or pd.read_parquet("results/demo.parquet")
  final = m[m.iteration == m.groupby("config").iteration.transform("max")]
  print(final.groupby("eps").psi.describe())
  ledger = pd.read_csv("results/demo.ledger.csv")
  print(ledger[["config", "agent", "mechanism", "releases", "eps_pld"]])
"""


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line. `words`: the command's words (main's, options left out): the arguments
    of `data ...` and `forecast`, whose modules cost imports (readers, downloads, analysis), are
    added only when the command is theirs, so `mpi-dp run` never imports them (None: every
    command's arguments)."""

    def wanted(command: str) -> bool:
        return words is None or list(words[:1]) == [command]

    fmt = argparse.RawDescriptionHelpFormatter
    ap = _Parser(prog="mpi-dp", description=DESCRIPTION, formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"mpi_dp {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True,
                            parser_class=_Parser)

    run = sub.add_parser("run", help="run a job file (under mpiexec, or on one rank)",
                         description="Run a TOML job file. Launch under MPI: "
                         "mpiexec -n P mpi-dp run JOB.toml", formatter_class=fmt)
    run.epilog_fn = _run_epilog
    run.add_argument("job", help="the TOML job file, e.g. jobs/demo.toml")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a job key (TOML value; dotted keys for sections, e.g. "
                     "step.alpha=0.5); repeatable")
    run.add_argument("--out", metavar="PATH", help="result file (overrides the job's output)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace an existing result (or a stopped job's PATH.partial); the old "
                     "file stays until the new job completes. Without it a run never replaces "
                     "a result")
    run.add_argument("--resume", nargs="?", const="yes", choices=("yes", "auto"),
                     help="continue the job's PATH.partial left by a stopped (killed, failed, "
                     "requeued) run of the same job and --set options: complete "
                     "configurations are kept, the others run again; the final file has the "
                     "same datasets, bit for bit, as an uninterrupted run. --resume=auto: "
                     "resume if PATH.partial exists, else start (what slurm/run.sbatch passes "
                     "on a requeue)")
    from .results.parts import parse_block, parse_configs

    which = run.add_mutually_exclusive_group()
    which.add_argument("--configs", type=parse_configs, metavar="A:B",
                       help="run only configurations A..B-1 (0-based, as /configs/00A; 'A:', "
                       "':B' and one index A work too) into a part file that records the "
                       "block; mpi-dp merge combines the parts")
    which.add_argument("--config-block", type=parse_block, metavar="I/N",
                       help="run only block I (0-based) of N equal blocks of the "
                       "configurations: [I*C//N, (I+1)*C//N) of C (empty when N > C); what "
                       "slurm/sweep.sbatch runs in array task I")
    run.add_argument("--task-file", action="store_true",
                     help="with --config-block I/N: write OUT.taskI.h5 (OUT: --out or the job's "
                     "output; results/x.h5 -> results/x.task0.h5 ...), the names `mpi-dp merge "
                     "OUT` looks for")
    _verbosity_arguments(run)
    run.add_argument("--force", action="store_true",
                     help="start even when the estimate printed before the first iteration says "
                     "the result will not fit on its disk or the job would run over a month "
                     "(a job past the node's memory never starts)")
    run.set_defaults(func=_cmd_run)

    aud = sub.add_parser(
        "audit", help="measure a job's privacy empirically (distinguishing game, eps_lower)",
        description="Run the job on two neighbouring datasets D and D' (one record of one owner "
        "differs) with R runs each, through the same code as `mpi-dp run`, record what leaves "
        "that owner, and bound eps from below: eps_lower = ln((1 - delta - FNR) / FPR) with "
        "Clopper-Pearson 95 % bounds of the best threshold test (chosen on half the runs, "
        "evaluated on the other half). Verdict: consistent (eps_lower <= the claim: the smaller "
        "of the owner's ledger eps and the job's eps) or VIOLATION. The job must have one "
        "configuration. Launch under MPI like run: mpiexec -n P mpi-dp audit JOB.toml",
        formatter_class=fmt)
    aud.add_argument("job", help="the TOML job file (one configuration), e.g. "
                     "jobs/audit_sync_star.toml")
    aud.add_argument("--canary", default="worst", metavar="worst|INDEX",
                     help="worst: record 0 of the owner becomes the canary, with opposite labels "
                     "in the two worlds (default); INDEX: D keeps the owner's record INDEX, D' "
                     "replaces it by the canary")
    aud.add_argument("--shape", default="axis", choices=("axis", "spread"),
                     help="canary features: axis = the file's largest |x_ij| on feature 0 "
                     "(default; tight for coordinate-wise noise); spread = that value on every "
                     "feature (the largest L1 norm; for sensitivities that grow with ||x||_1)")
    aud.add_argument("--owner", type=int, default=0, help="the audited data owner (default 0)")
    aud.add_argument("--runs", type=int, default=20_000,
                     help="runs per world, vectorised (default 20000; 1e5 for tight bounds)")
    aud.add_argument("--release", default="1", metavar="k|all|final",
                     help="audit the owner's k-th release (default 1), all its releases "
                     "together (a composition audit; keep T small), or the final model the "
                     "method outputs (post-processing of all releases; claimed: the ledger "
                     "total)")
    aud.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a job key, as in run; repeatable")
    aud.add_argument("--out", metavar="PATH",
                     help="audit result (default results/<job name>_audit.h5; never overwritten)")
    _verbosity_arguments(aud)
    aud.set_defaults(func=_cmd_audit)

    data = sub.add_parser("data", help="make HDF5 shard files (one group per data owner)")
    dsub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    synth = dsub.add_parser("synth", help="synthetic shards (regression, binary, online, p2p)",
                            description="Write synthetic per-owner shards to an HDF5 shard file: "
                            "linear regression (y = X theta + noise) or binary classification "
                            "(y = sign(X theta + noise)), with a public hold-out.",
                            formatter_class=fmt)
    if wanted("data"):
        from .data.synth import add_synth_arguments

        add_synth_arguments(synth)
    synth.set_defaults(func=_cmd_synth)

    prep = dsub.add_parser("prepare", help="real data -> shard file (recipes, CSV, LIBSVM)",
                           description="Turn real data into an HDF5 shard file: read the source, "
                           "preprocess, partition into agents, write atomically, print a summary. "
                           "Either a named recipe (each paper's data setting) or a CSV/LIBSVM "
                           "file of your own.", formatter_class=fmt)
    if wanted("data"):
        from .data.prepare_cli import add_prepare_arguments

        add_prepare_arguments(prep)
    prep.set_defaults(func=_cmd_prepare)

    fetch = dsub.add_parser("fetch", help="download a dataset's original files (SHA-256 checked)",
                            description="Download a dataset's original files from their official "
                            "URLs into the cache (SHA-256 checked), or from a mirror.",
                            formatter_class=fmt)
    if wanted("data"):
        from .data.fetch import add_fetch_arguments

        add_fetch_arguments(fetch)
    fetch.set_defaults(func=_cmd_fetch)

    upg = dsub.add_parser("upgrade", help="an old shard file (one group per owner) -> block "
                          "layout (fast start-up)",
                          description="Write a format_version-1 shard file (one HDF5 group per "
                          "owner, read one owner at a time) again in the block layout "
                          "(format_version 2: a rank's owners in a few large reads), the same "
                          "data bit for bit.")
    if wanted("data"):
        from .data.upgrade_cli import add_upgrade_arguments

        add_upgrade_arguments(upg)
    upg.set_defaults(func=_cmd_upgrade)

    an = sub.add_parser("analyze", help="table per configuration of a result file",
                        description="Print the method's table of a result file (star methods: per "
                        "configuration the final metric's median, quartiles, mean and standard "
                        "error, each owner's isolated baseline and, for sweeps, the fitted "
                        "log-log slopes against eps and n; admm: final test error per variant and "
                        "eps_bar against OutP), then every agent's privacy ledger: mechanism, "
                        "releases, per-release eps and the total eps at the job's delta under "
                        "basic, advanced (Dwork-Rothblum-Vadhan), PLD and RDP composition.")
    an.add_argument("result", help="result HDF5 file written by mpi-dp run")
    an.add_argument("--metric", default=None, help="metric to summarise (default: the method's, "
                    "psi for the star methods, test_error for admm)")
    an.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    an.set_defaults(func=_cmd_analyze)

    pl = sub.add_parser("plot", help="PNG figures of a result file",
                        description="Draw the method's figures: for the star methods the metric vs "
                        "iteration (median and 25-75 % band, log scale) and, for sweeps, final "
                        "E[metric] vs eps and vs n (log-log, fitted slopes) and the collaboration "
                        "map over owner 1's (n, eps) (async_star adds the schedule, the fitted "
                        "bound and the facility figures); admm: test error and noise vs "
                        "iteration, final error vs eps_bar and consensus.")
    pl.add_argument("result", help="result HDF5 file written by mpi-dp run")
    pl.add_argument("--out", metavar="PREFIX",
                    help="file name prefix of the PNGs (default: the result path without .h5)")
    pl.add_argument("--metric", default=None, help="metric to plot (default: the method's)")
    pl.set_defaults(func=_cmd_plot)

    cmp = sub.add_parser(
        "compare", help="one table and one figure across result files of any method",
        description="Put result files of any method (sync_star, async_star, admm, dola, p2p) side "
        "by side: one row per file and configuration, and one figure of the metric against eps.\n"
        "\nColumns:\n"
        "  file, #     the file (its letter, listed above the table) and the configuration index\n"
        "  method      the algorithm; variant: the configuration's distinguishing keys (method\n"
        "              variant / loss / calibration rule, and the swept keys other than eps)\n"
        "  eps, delta  the owners' guarantee from the privacy ledger: the largest total over\n"
        "              owners of what each owner's guarantee composes, by the PLD accountant, at\n"
        "              the owner's delta; scope: configuration, record (dola: the per-record\n"
        "              total) or selection (p2p.select); inf = no noise (not private, also\n"
        "              where a ledger records 0 for releases without noise); ! = no finite,\n"
        "              certified guarantee otherwise (uncertified noise ...: a note says why)\n"
        "  runs        runs with a finite final value\n"
        "  test_error  (classification) or rmse (regression): the final model's median over\n"
        "              runs, then min..max over runs; on: measured on the test set or, where the\n"
        "              file has none, on the training records (the star methods' squared loss\n"
        "              records a training MSE: rmse = its square root)\n"
        "  majority    (or mean) the trivial baseline: always the most frequent label (or the\n"
        "              mean); zero: the model at zero; optimum: the non-private optimum theta*\n"
        "  cfg_s       the configuration's wall time where recorded; run_s: the whole run's\n"
        "  note        a footnote under the table, e.g. why a value is '-' (not recorded)\n"
        "\nThe figure draws the median (bars: min..max) against eps on a log axis, eps = inf as\n"
        "open markers at the right, the baselines as horizontal lines (dashed: majority or mean,\n"
        "dotted: zero, dash-dot: optimum). Files of a classification and a regression task are\n"
        "refused together under --metric auto.",
        epilog="Examples:\n"
        "  mpi-dp compare results/demo.h5 results/sync_fig3_eps.h5      # -> results/compare.png\n"
        "  mpi-dp compare results/dola_fig3ab_diabetes.h5 results/dola_fig6_diabetes.h5 \\\n"
        "      --out figs/dola.png\n"
        "  mpi-dp compare results/admm_mnist.h5 results/dola_mnist_parity.h5 --metric test_error",
        formatter_class=fmt)
    cmp.add_argument("results", nargs="+", metavar="RESULT.h5",
                     help="result files written by mpi-dp run (any method)")
    cmp.add_argument("--out", metavar="FIG.png",
                     help="the figure (default: compare.png next to the first file); an existing "
                     "figure is replaced only with --overwrite")
    cmp.add_argument("--overwrite", action="store_true",
                     help="replace an existing figure (never done silently)")
    cmp.add_argument("--metric", default="auto", choices=("auto", "test_error", "rmse"),
                     help="auto (default): test_error for classification results, rmse for "
                     "regression; a file without the metric shows '-'")
    cmp.set_defaults(func=_cmd_compare)

    fc = sub.add_parser("forecast", help="fit the cost-of-privacy bound; predict coalitions",
                        description="Fit the cost-of-privacy bound E[psi] = floor + c1 sqrt(S)/n "
                        "+ c2 S/n^2 (S = sum_i 1/eps_i^2, n = sum_i n_i) to sweeps of result files, "
                        "then predict E[psi] for a proposed coalition and whether each owner gains "
                        "by joining.", formatter_class=fmt)
    if wanted("forecast"):
        from .analysis.forecast_cli import add_forecast_arguments

        add_forecast_arguments(fc)
    fc.set_defaults(func=_cmd_forecast)

    mg = sub.add_parser(
        "merge", help="combine the part files of a split sweep into one result",
        description="Combine the part files of one job, written by `mpi-dp run --configs A:B` or\n"
        "`--config-block I/N` (e.g. the array tasks of slurm/sweep.sbatch), into OUT: the file the\n"
        "whole job writes, every dataset equal bit for bit, with the root attributes of a complete\n"
        "result (status complete; merged_from lists the parts; provenance: the hosts of all parts,\n"
        "the earliest start, the latest end, wall_seconds summed).\n\n"
        "The parts must come from one job and --set options (the same job_resolved apart from\n"
        "output), each be complete, and together hold every configuration exactly once; otherwise\n"
        "nothing is written, the exit status is 2 and the message says what is wrong (missing\n"
        "configurations and the task files that would hold them, overlapping parts, differing\n"
        "keys). OUT is written as OUT.partial and renamed when complete; an existing OUT is\n"
        "replaced only with --overwrite.",
        epilog="Examples:\n"
        "  sbatch --array=0-3 slurm/sweep.sbatch jobs/demo.toml   # results/demo.task0..3.h5\n"
        "  mpi-dp merge results/demo.h5                         # reads results/demo.task*.h5\n"
        "  mpi-dp merge results/all.h5 parts/a.h5 parts/b.h5\n"
        "  mpi-dp merge results/all.h5 parts/                   # every *.h5 in parts/\n"
        "  mpi-dp merge results/all.h5 'parts/run*.h5'         # a quoted glob",
        formatter_class=fmt)
    mg.add_argument("out", metavar="OUT", help="the merged result file, e.g. results/demo.h5")
    mg.add_argument("parts", nargs="*", metavar="PART",
                    help="part files, directories (their *.h5 files) or globs; default: OUT's "
                    "task files (results/demo.task*.h5 for results/demo.h5)")
    mg.add_argument("--overwrite", action="store_true",
                    help="replace an existing OUT (it stays until the merged file is complete)")
    _verbosity_arguments(mg, quiet_help="no summary line")
    mg.set_defaults(func=_cmd_merge)

    ex = sub.add_parser("export", help="tidy tables (CSV, Parquet) or a shareable release",
                        description=EXPORT_DESCRIPTION, epilog=EXPORT_EPILOG,
                        formatter_class=fmt)
    ex.add_argument("result", metavar="RESULT.h5", help="result file written by mpi-dp run")
    ex.add_argument("--format", choices=("csv", "parquet"), default=None,
                    help="the tables' format (default: from --out's suffix, else csv); parquet "
                    "needs pyarrow (pip install pyarrow, or the mpi_dp[export] extra)")
    ex.add_argument("--out", metavar="PATH",
                    help="the metrics table (default RESULT's stem .csv / .parquet beside it; "
                    "the ledger: <stem>.ledger.<ext> beside it) or, with --release, the "
                    "release file (default <stem>.release.h5)")
    ex.add_argument("--release", action="store_true",
                    help="write the shareable release file (HDF5) instead of the tables")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace existing output files (never the result itself)")
    ex.add_argument("--force", action="store_true",
                    help="with --release: release a result whose status is not complete")
    ex.add_argument("--include-nonprivate", action="store_true",
                    help="with --release: keep the models and values of configurations without "
                    "a finite, certified DP guarantee (eps = inf, uncertified, no ledger), which "
                    "a release leaves out; the file then carries the root attribute "
                    "release_warning and the command warns")
    ex.set_defaults(func=_cmd_export)

    info = sub.add_parser("info", help="versions of mpi_dp, MPI, numpy, h5py, scipy, petsc4py")
    info.set_defaults(func=_cmd_info)
    return ap


def main(argv: list[str] | None = None) -> int:
    global _EARLY
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    if words and words[0] in COLLECTIVE:  # before the parser, which loads the methods (~2 s)
        _EARLY = _EarlyStop()
        if os.environ.get("MPI_DP_TEST_TERM_AT_START"):  # test seam: Slurm's warning, early
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
    args = build_parser(words).parse_args(argv)
    from .progress import configure

    configure(_verbosity(args))
    try:
        return int(args.func(args) or 0)
    except MpiDpError as e:
        print(f"mpi-dp: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"mpi-dp: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # e.g. --csv or plot --out where we may not write
        where = f"{e.filename}: " if e.filename else ""
        print(f"mpi-dp: error: cannot write or read {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: only MpiDpError (and I/O on the user's paths) is the user's
        print(f"mpi-dp: internal error: {type(e).__name__}: {e}\n{_tagged_traceback(0, 1)}"
              "mpi-dp: this is a bug in mpi_dp, not in your command: please report it with the "
              "traceback above", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
