"""Point-to-point star messaging for the asynchronous method: one-on-one query / response.

Knows nothing about learning: the learner side moves query points to the hosts of the owners it
serves and gets their answers back; the host side calls an `answer` callback. All messages are
float64 buffers (buffer-based Send/Recv); layouts (m rows, p features):

  QRY   learner -> host   [k, m, m x (owner, run, theta_bar[p])]
  RSP   host -> learner   [k, m, m x (owner, run, status, r[p])]   -- exactly what leaves an owner
  REQ   host -> learner   [owner, tick time]                      (live, owner_request)
  POLL  learner -> host   [seq];  CLAIM host -> learner [seq, owner or -1]; DENY learner -> host
  STOP  learner -> host   [0];    ACK host -> learner [dropped ticks]
  SNAP  learner -> host   [0];    STATE host -> learner: pickled [(owner, state), ...] (replay
        checkpoints: the hosted owners' states; a small control message, not owner data)

Waiting is polite, because MPICH busy-polls in its blocking calls and on oversubscribed cores a
polling rank takes the core of the rank it waits for: a short spin on Iprobe / Test that gives the
core away between probes (sched_yield; MPI_DP_SPIN_YIELD=0 spins hard), then naps that double up
to a cap. A live host whose owners have all asked predicts when its next query comes (HostWait)
and sleeps through most of that time in one nap. On Linux the ranks of a star lower their timer
slack (MPI_DP_TIMER_SLACK_NS, default 1 us; the kernel's default of 50 us is added to every nap).
The knobs are the module constants below (environment variables MPI_DP_*).

The live hot path allocates nothing per message: persistent receives into preallocated buffers on
the learner (OwnerQuery, next_request) and on the hosts (HostSlot), each owner's REQ from its own
buffer.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import ProtocolError
from .layout import Layout

QRY, RSP, REQ, POLL, CLAIM, DENY, STOP, ACK, SNAP, STATE = 11, 12, 13, 14, 15, 16, 17, 18, 19, 20
TAG_NAMES = {QRY: "QRY", RSP: "RSP", REQ: "REQ", POLL: "POLL", CLAIM: "CLAIM", DENY: "DENY",
             STOP: "STOP", ACK: "ACK", SNAP: "SNAP", STATE: "STATE"}
#: status codes in RSP rows
DECLINED, ANSWERED, LAST_ANSWER = 0, 1, 2

SPIN_S = float(os.environ.get("MPI_DP_SPIN_S", 5e-5))
#: the learner waiting for an answer is on the critical path: it spins longer before napping
ANSWER_SPIN_S = float(os.environ.get("MPI_DP_ANSWER_SPIN_S", 1e-3))
MAX_SLEEP_S = float(os.environ.get("MPI_DP_MAX_SLEEP_S", 1e-4))
#: the first nap after a spin (naps then double up to the cap)
FIRST_NAP_S = 1e-5
#: spin politely: give the core away (sched_yield) between probes, so that on oversubscribed
#: cores a waiting rank never holds up the rank it waits for (free when nothing else is runnable)
SPIN_YIELD = os.environ.get("MPI_DP_SPIN_YIELD", "1") not in ("0", "") and hasattr(os,
                                                                                     "sched_yield")
#: a live host waiting for its next query: after its predicted sleep (HostWait) a short spin,
#: then naps up to a longer cap (its wake-ups take CPU time from the learner and the host being
#: served on oversubscribed cores)
HOST_SPIN_S = float(os.environ.get("MPI_DP_HOST_SPIN_S", 5e-5))
HOST_MAX_SLEEP_S = float(os.environ.get("MPI_DP_HOST_MAX_SLEEP_S", 1e-4))
#: the share of the predicted time to its next query a live host sleeps through in one nap (0: off)
HOST_PREDICT = float(os.environ.get("MPI_DP_HOST_PREDICT", 0.8))
#: after that nap it spins (yielding) for up to this share of the predicted time before napping
HOST_PREDICT_SPIN = float(os.environ.get("MPI_DP_HOST_PREDICT_SPIN", 0.5))

#: timer slack (ns) a star rank asks for (prctl PR_SET_TIMERSLACK; 0 leaves the default)
TIMER_SLACK_NS = int(os.environ.get("MPI_DP_TIMER_SLACK_NS", 1000))


def set_timer_slack(ns: int = TIMER_SLACK_NS) -> bool:
    """Ask Linux for `ns` of timer slack for this process (naps overshoot by up to that much);
    returns whether it was set (False elsewhere or with ns <= 0)."""
    if ns <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(29, int(ns), 0, 0, 0) == 0  # SET_TIMERSLACK
    except (OSError, AttributeError):
        return False


#: answer(owners (m,), runs (m,), thetas (m, p)) -> (status (m,), responses (m, p))
AnswerFn = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
#: state() -> [(owner, checkpoint state), ...] of the owners hosted on a rank
StateFn = Callable[[], list[tuple[int, Any]]]


def _wait(probe: Callable[[], bool], spin_s: float, max_sleep_s: float) -> None:
    """Until probe() is true: probe, yielding the core between probes (SPIN_YIELD), for
    `spin_s`, then nap between probes, the naps doubling from FIRST_NAP_S up to `max_sleep_s`."""
    if probe():
        return
    t0 = time.perf_counter()
    nap = FIRST_NAP_S
    while not probe():
        if time.perf_counter() - t0 > spin_s:
            time.sleep(nap)
            nap = min(2 * nap, max_sleep_s)
        elif SPIN_YIELD:
            os.sched_yield()


def wait_message(comm: MPI.Comm, source: int, tag: int, spin_s: float | None = None,
                 status: MPI.Status | None = None, max_sleep_s: float | None = None) -> MPI.Status:
    """Block until a matching message is pending; spin briefly, then sleep (polite under load).

    Spins on Iprobe for `spin_s` (SPIN_S), then naps that double from FIRST_NAP_S up to
    `max_sleep_s` (MAX_SLEEP_S). `status`: an MPI.Status to fill (none is allocated)."""
    st = MPI.Status() if status is None else status
    _wait(lambda: comm.Iprobe(source, tag, st), SPIN_S if spin_s is None else spin_s,
          MAX_SLEEP_S if max_sleep_s is None else max_sleep_s)
    return st


def wait_request(req: MPI.Request, st: MPI.Status, spin_s: float | None = None,
                 max_sleep_s: float | None = None) -> MPI.Status:
    """wait_message for a posted receive `req` (Test instead of Iprobe); fills `st`."""
    _wait(lambda: req.Test(st), SPIN_S if spin_s is None else spin_s,
          MAX_SLEEP_S if max_sleep_s is None else max_sleep_s)
    return st


def recv_pending(comm: MPI.Comm, st: MPI.Status) -> np.ndarray:
    """Receive the probed message `st` into a fresh float64 buffer."""
    buf = np.empty(st.Get_count(MPI.DOUBLE))
    comm.Recv([buf, MPI.DOUBLE], source=st.Get_source(), tag=st.Get_tag())
    return buf


def pack_query(k: int, owners: np.ndarray, runs: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    m, p = thetas.shape
    buf = np.empty(2 + m * (2 + p))
    buf[0], buf[1] = k, m
    rows = buf[2:].reshape(m, 2 + p)
    rows[:, 0], rows[:, 1], rows[:, 2:] = owners, runs, thetas
    return buf


def unpack_query(buf: np.ndarray, p: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    k, m = int(buf[0]), int(buf[1])
    if buf.size != 2 + m * (2 + p):
        raise ProtocolError(f"QRY of {buf.size} numbers does not hold {m} rows of p = {p}")
    rows = buf[2:].reshape(m, 2 + p)
    return k, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2:]


def pack_response(k: int, owners: np.ndarray, runs: np.ndarray, status: np.ndarray,
                  resp: np.ndarray) -> np.ndarray:
    m, p = resp.shape
    buf = np.empty(2 + m * (3 + p))
    buf[0], buf[1] = k, m
    rows = buf[2:].reshape(m, 3 + p)
    rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3:] = owners, runs, status, resp
    return buf


class P2PStar:
    """Learner (rank 0) <-> owner hosts, one-on-one. Owners are laid out in blocks (Layout)."""

    def __init__(self, comm: MPI.Comm, layout: Layout, p: int) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.layout = layout
        self.p = p
        self._starts = layout.block_starts()
        counts = layout.counts()
        self.hosts = [h for h in range(1, self.size) if counts[h] > 0]
        self.t0 = 0.0
        self._status = MPI.Status()  # reused by the live hot path (no per-message objects)
        self._req = np.empty(2)
        self._req_recv: MPI.Prequest | None = None
        self._poll, self._claim, self._deny = np.empty(1), np.empty(2), np.empty(1)
        set_timer_slack()

    @property
    def is_learner(self) -> bool:
        return self.rank == 0

    def host_of(self, owners: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, owners, side="right") - 1

    def start_clock(self) -> None:
        """Common start (a barrier), then every rank's wall clock t0."""
        self.comm.Barrier()
        self.t0 = MPI.Wtime()

    def now(self) -> float:
        return MPI.Wtime() - self.t0

    # -- learner side ----------------------------------------------------------------------
    def query(self, k: int, owners: np.ndarray, runs: np.ndarray, thetas: np.ndarray,
              local_answer: AnswerFn | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Send query points to the hosts of `owners`, collect (status, responses) row by row.

        Every host gets one QRY with its rows; answers are received host by host in rank order.
        Rows of owners hosted on rank 0 (one-rank runs) go to `local_answer` directly.
        """
        host = self.host_of(owners)
        status = np.empty(owners.size, dtype=np.int64)
        resp = np.empty((owners.size, self.p))
        groups = [(h, np.flatnonzero(host == h)) for h in np.unique(host)]
        for h, idx in groups:
            if h != 0:
                self.comm.Send([pack_query(k, owners[idx], runs[idx], thetas[idx]), MPI.DOUBLE],
                               dest=int(h), tag=QRY)
        for h, idx in groups:
            if h == 0:
                if local_answer is None:
                    raise ProtocolError("owners hosted on the learner's rank need local_answer")
                status[idx], resp[idx] = local_answer(owners[idx], runs[idx], thetas[idx])
            else:
                status[idx], resp[idx] = self._receive_answer(int(h), k, owners[idx], runs[idx])
        return status, resp

    def _receive_answer(self, host: int, k: int, owners: np.ndarray, runs: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        st = wait_message(self.comm, host, RSP, ANSWER_SPIN_S)
        buf = recv_pending(self.comm, st)
        m = owners.size
        if buf.size != 2 + m * (3 + self.p) or int(buf[0]) != k or int(buf[1]) != m:
            raise ProtocolError(f"learner: bad RSP from rank {host} for k={k} ({buf.size} numbers)")
        rows = buf[2:].reshape(m, 3 + self.p)
        if not (np.array_equal(rows[:, 0], owners) and np.array_equal(rows[:, 1], runs)):
            raise ProtocolError(f"learner: RSP from rank {host} at k={k} does not echo the "
                                "(owner, run) pairs it was asked")
        return rows[:, 2].astype(np.int64), rows[:, 3:]

    def snapshot(self, local_state: StateFn | None = None) -> list[tuple[int, Any]]:
        """Every owner's checkpoint state, [(owner, state), ...]: SNAP to each host, its STATE
        reply, and `local_state()` for owners hosted on rank 0 (one-rank runs)."""
        for h in self.hosts:
            self.comm.Send([np.zeros(1), MPI.DOUBLE], dest=h, tag=SNAP)
        states = list(local_state()) if local_state is not None else []
        for h in self.hosts:
            wait_message(self.comm, h, STATE, ANSWER_SPIN_S)
            states.extend(self.comm.recv(source=h, tag=STATE))
        return states

    def stop_hosts(self) -> None:
        for h in range(1, self.size):
            self.comm.Send([np.zeros(1), MPI.DOUBLE], dest=h, tag=STOP)

    def next_request(self) -> tuple[int, int, float]:
        """Live owner_request: the next REQ in arrival order -> (host rank, owner, tick time).
        Received by a persistent receive into a preallocated buffer (posted only while waiting,
        so none is left posted when the learner stops)."""
        req = self._req_recv
        if req is None:
            req = self._req_recv = self.comm.Recv_init([self._req, MPI.DOUBLE], MPI.ANY_SOURCE,
                                                       REQ)
        req.Start()
        st = wait_request(req, self._status)
        if st.Get_count(MPI.DOUBLE) != 2:
            raise ProtocolError(f"learner: REQ of {st.Get_count(MPI.DOUBLE)} numbers from rank "
                                f"{st.Get_source()}")
        return st.Get_source(), int(self._req[0]), float(self._req[1])

    def owner_query(self, runs: int) -> OwnerQuery:
        """Preallocated QRY / RSP buffers for live queries of all `runs` runs to one owner."""
        return OwnerQuery(self, runs)

    def poll(self, seq: int) -> list[tuple[int, int]]:
        """Live learner_broadcast: POLL every host; the CLAIMs (host, owner) in arrival order."""
        msg, claim, st = self._poll, self._claim, self._status
        msg[0] = seq
        for h in self.hosts:
            self.comm.Send([msg, MPI.DOUBLE], dest=h, tag=POLL)
        claims = []
        for _ in self.hosts:
            wait_message(self.comm, MPI.ANY_SOURCE, CLAIM, status=st)
            if st.Get_count(MPI.DOUBLE) != 2:
                raise ProtocolError(f"learner: CLAIM of {st.Get_count(MPI.DOUBLE)} numbers")
            src = st.Get_source()
            self.comm.Recv([claim, MPI.DOUBLE], source=src, tag=CLAIM)
            if int(claim[0]) != seq:
                raise ProtocolError(f"learner: CLAIM for poll {int(claim[0])} during poll {seq}")
            if claim[1] >= 0:
                claims.append((src, int(claim[1])))
        return claims

    def deny(self, host: int, seq: int) -> None:
        self._deny[0] = seq
        self.comm.Send([self._deny, MPI.DOUBLE], dest=host, tag=DENY)

    def stop_and_drain(self) -> np.ndarray:
        """STOP every host; discard late REQs until each host ACKs; returns their ACK payloads."""
        if self._req_recv is not None:  # next_request's receive (not posted between requests)
            self._req_recv.Free()
            self._req_recv = None
        self.stop_hosts()
        acks: dict[int, np.ndarray] = {}
        while len(acks) < self.size - 1:
            st = wait_message(self.comm, MPI.ANY_SOURCE, MPI.ANY_TAG)
            buf = recv_pending(self.comm, st)
            if st.Get_tag() == ACK:
                acks[st.Get_source()] = buf
            elif st.Get_tag() not in (REQ, CLAIM):
                raise ProtocolError(f"learner: unexpected {TAG_NAMES.get(st.Get_tag())} while "
                                    "stopping")
        return np.array([acks[h][0] for h in sorted(acks)])

    # -- host side -------------------------------------------------------------------------
    def _answer_query(self, buf: np.ndarray, answer: AnswerFn) -> tuple[np.ndarray, np.ndarray]:
        k, owners, runs, thetas = unpack_query(buf, self.p)
        status, resp = answer(owners, runs, thetas)
        self.comm.Send([pack_response(k, owners, runs, status, resp), MPI.DOUBLE], dest=0, tag=RSP)
        return owners, status

    def serve(self, answer: AnswerFn, state: StateFn | None = None) -> None:
        """Replay mode host loop: answer QRYs until STOP; a SNAP gets `state()` back (STATE)."""
        while True:
            st = wait_message(self.comm, 0, MPI.ANY_TAG)
            buf = recv_pending(self.comm, st)
            tag = st.Get_tag()
            if tag == STOP:
                return
            if tag == SNAP:
                self.comm.send(state() if state is not None else [], dest=0, tag=STATE)
                continue
            if tag != QRY:
                raise ProtocolError(f"rank {self.rank}: unexpected {TAG_NAMES.get(tag, tag)} "
                                    "from the learner")
            self._answer_query(buf, answer)

    def serve_live(self, protocol: str, clocks: OwnerClocks, answer: AnswerFn,
                   runs: int = 1) -> None:
        """Live host loop for `protocol`: owner_request or learner_broadcast, until STOP + ACK.

        The learner's messages (at most `runs` rows: live QRYs ask one owner for every run) arrive
        through one persistent receive, posted again after each message is handled; a QRY of one
        owner is answered by `answer.into` straight into a preallocated RSP buffer (HostSlot), and
        each owner's REQ goes from its own two-number buffer (its previous REQ, long received by
        then, completed first): the loop allocates nothing per message."""
        st = MPI.Status()
        slot = HostSlot(self.p, runs)
        into = getattr(answer, "into", None)
        recv = self.comm.Recv_init([slot.qbuf, MPI.DOUBLE], 0, MPI.ANY_TAG)
        reqs: dict[int, tuple[np.ndarray, MPI.Request]] = {}  # owner -> (REQ buffer, its Isend)
        claim = np.empty(2)
        waiter = HostWait()
        recv.Start()
        while True:
            if protocol == "owner_request":
                if not recv.Test(st):
                    for a, tick in clocks.due_requests(self.now()):
                        self._request(reqs, a, tick)
                    wait = clocks.time_to_next(self.now())
                    if wait is None:  # every owner waits for service or is done: block politely
                        waiter.wait(recv, st)
                    else:
                        time.sleep(min(max(wait, 0.0), MAX_SLEEP_S))
                        continue
            else:
                wait_request(recv, st, HOST_SPIN_S, HOST_MAX_SLEEP_S)
            waiter.noticed()
            tag, count = st.Get_tag(), st.Get_count(MPI.DOUBLE)
            if tag == STOP:
                break
            if tag == QRY:
                if into is not None and slot.holds(count):
                    a, status = slot.answer(into)
                    self.comm.Send([slot.rsp, MPI.DOUBLE], dest=0, tag=RSP)
                    waiter.answered(a)
                    clocks.served_one(a, status, self.now())
                else:
                    owners, statuses = self._answer_query(slot.qbuf[:count].copy(), answer)
                    waiter.answered(int(owners[0]))
                    clocks.served(owners, statuses, self.now())
            elif tag == POLL:
                claim[0], claim[1] = slot.qbuf[0], float(clocks.claim(self.now()))
                self.comm.Send([claim, MPI.DOUBLE], dest=0, tag=CLAIM)
            elif tag != DENY:
                raise ProtocolError(f"rank {self.rank}: unexpected {TAG_NAMES.get(tag, tag)}")
            recv.Start()
        recv.Free()
        MPI.Request.Waitall([r for _, r in reqs.values()])
        self.comm.Send([np.array([float(clocks.dropped)]), MPI.DOUBLE], dest=0, tag=ACK)

    def _request(self, reqs: dict[int, tuple[np.ndarray, MPI.Request]], a: int,
                 tick: float) -> None:
        """Isend owner a's REQ [a, tick] from its own buffer."""
        prev = reqs.get(a)
        if prev is None:
            buf = np.empty(2)
        else:
            buf = prev[0]
            prev[1].Wait()  # the learner received it before serving a: complete, buffer free
        buf[0], buf[1] = a, tick
        reqs[a] = (buf, self.comm.Isend([buf, MPI.DOUBLE], dest=0, tag=REQ))


class HostSlot:
    """A live host's receive buffer (room for a QRY of `runs` rows) and the RSP buffer of such a
    QRY, with their row views made once."""

    def __init__(self, p: int, runs: int) -> None:
        self.m = runs
        self.qbuf = np.empty(2 + runs * (2 + p))
        self.rows = self.qbuf[2:].reshape(runs, 2 + p)
        self.thetas = self.rows[:, 2:]
        self.rsp = np.empty(2 + runs * (3 + p))
        self.rrows = self.rsp[2:].reshape(runs, 3 + p)
        self.status = self.rrows[:, 2]
        self.resp = self.rrows[:, 3:]
        self.runs = np.empty(runs, dtype=np.int64)

    def holds(self, count: int) -> bool:
        """Whether the message received is a full QRY of one owner (the hot path)."""
        return (count == self.qbuf.size and int(self.qbuf[1]) == self.m
                and (self.m == 1 or bool(np.all(self.rows[:, 0] == self.rows[0, 0]))))

    def answer(self, into: Callable) -> tuple[int, int]:
        """Answer the QRY in qbuf into rsp through `into`; returns (owner, status of row 0)."""
        rows, rrows = self.rows, self.rrows
        a = int(rows[0, 0])
        if self.m == 1:  # [k, 1, owner, run] heads both messages
            self.rsp[:4] = self.qbuf[:4]
            self.runs[0] = rows[0, 1]
        else:
            self.rsp[:2] = self.qbuf[:2]
            rrows[:, :2] = rows[:, :2]
            self.runs[:] = rows[:, 1]
        into(a, self.runs, self.thetas, self.status, self.resp)
        return a, int(rrows[0, 2])


class HostWait:
    """How a live owner_request host waits for the learner's next query, all its owners asked.

    The learner serves requests in arrival order, so under steady load the time from this host's
    answer for owner a to its next query repeats from one round to the next (round robin when
    every owner always has a request queued). The host keeps the last few such gaps per owner a;
    after answering a it sleeps in one nap through HOST_PREDICT of the shortest (less its naps'
    measured overshoot), then spins (yielding) for up to HOST_PREDICT_SPIN of it, then naps up to
    HOST_MAX_SLEEP_S. It is then awake when its query comes, without spinning or waking all the
    while in between. A gap is measured to when the host noticed the query, which a late wake-up
    only lengthens; the shortest of the last few is the one met while awake. Without a gap for a
    (its first answers) it waits as wait_message does (spin HOST_SPIN_S, then naps).
    """

    KEEP = 4

    def __init__(self, predict: float | None = None) -> None:
        self.predict = HOST_PREDICT if predict is None else predict
        self.gaps: dict[int, list[float]] = {}
        self.last: int | None = None  # the owner answered last, while no message came since
        self.t_last = 0.0
        self.overshoot = 3e-5  # how much longer than asked a nap lasts (running estimate)

    def answered(self, owner: int) -> None:
        self.last, self.t_last = owner, time.perf_counter()

    def noticed(self) -> None:
        """A message from the learner came (called on receiving it): ends the gap."""
        if self.last is not None:
            gaps = self.gaps.setdefault(self.last, [])
            gaps.append(time.perf_counter() - self.t_last)
            if len(gaps) > self.KEEP:
                del gaps[0]
            self.last = None

    def wait(self, recv: MPI.Request, st: MPI.Status) -> MPI.Status:
        """Wait for the posted receive `recv` (the learner's next message); fills `st`."""
        gaps = self.gaps.get(self.last) if self.last is not None and self.predict > 0 else None
        if gaps:
            if recv.Test(st):
                return st
            t = time.perf_counter()
            gap = min(gaps)
            nap = self.t_last + self.predict * gap - self.overshoot - t
            if nap > 0:
                time.sleep(nap)
                over = time.perf_counter() - t - nap
                self.overshoot += 0.25 * (min(max(over, 0.0), 1e-3) - self.overshoot)
            return wait_request(recv, st, max(HOST_SPIN_S, HOST_PREDICT_SPIN * gap),
                                HOST_MAX_SLEEP_S)
        return wait_request(recv, st, HOST_SPIN_S, HOST_MAX_SLEEP_S)


class OwnerQuery:
    """The learner's preallocated QRY and RSP buffers for one-owner queries of all R runs (live).

    The learner writes the query points into `points` (the theta_bar rows of the QRY buffer);
    `ask` posts the receive of the answer (a persistent receive per host), sends the QRY and
    waits; `resp` is a view of the answers (valid until the next ask). `close` frees the
    receives."""

    def __init__(self, link: P2PStar, runs: int) -> None:
        p = link.p
        self.link, self.R = link, runs
        self.qbuf = np.empty(2 + runs * (2 + p))
        self.qrows = self.qbuf[2:].reshape(runs, 2 + p)
        self.qrows[:, 1] = np.arange(runs)
        self.points = self.qrows[:, 2:]
        self.rbuf = np.empty(2 + runs * (3 + p))
        self.rrows = self.rbuf[2:].reshape(runs, 3 + p)
        self.resp = self.rrows[:, 3:]
        self._status = MPI.Status()
        self._recv: dict[int, MPI.Prequest] = {}

    def ask(self, k: int, owner: int, host: int) -> int:
        """QRY iteration k for `owner` on rank `host`, every run; returns run 0's status."""
        comm, R = self.link.comm, self.R
        recv = self._recv.get(host)
        if recv is None:
            recv = self._recv[host] = comm.Recv_init([self.rbuf, MPI.DOUBLE], host, RSP)
        self.qbuf[0], self.qbuf[1] = k, R
        if R == 1:
            self.qbuf[2] = owner
        else:
            self.qrows[:, 0] = owner
        recv.Start()  # posted before the QRY leaves: the answer lands in rbuf directly
        comm.Send([self.qbuf, MPI.DOUBLE], dest=host, tag=QRY)
        st = wait_request(recv, self._status, ANSWER_SPIN_S)
        rb, rr = self.rbuf, self.rrows
        if st.Get_count(MPI.DOUBLE) != rb.size or rb[0] != k or rb[1] != R:
            raise ProtocolError(f"learner: bad RSP from rank {host} for k={k} "
                                f"({st.Get_count(MPI.DOUBLE)} numbers)")
        if not (rr[0, 0] == owner and rr[0, 1] == 0 if R == 1
                else np.array_equal(rr[:, :2], self.qrows[:, :2])):
            raise ProtocolError(f"learner: RSP from rank {host} at k={k} does not echo the "
                                "(owner, run) pairs it was asked")
        return int(rr[0, 2])

    def close(self) -> None:
        for r in self._recv.values():
            r.Free()
        self._recv.clear()


class OwnerClocks:
    """Wall-clock Poisson clocks of the owners on one host (live mode).

    Ticks are Exp(rate) x unit seconds apart. owner_request: a tick sends a request unless one is
    outstanding (ticks meanwhile are dropped and counted). learner_broadcast: an owner is ready
    when its clock ticked since its last service; it claims on the next poll.
    """

    def __init__(self, agents: list[int], rates: np.ndarray, unit_s: float,
                 gens: dict[int, np.random.Generator], restart_after_service: bool = False) -> None:
        self.agents = list(agents)
        self.restart = restart_after_service
        self.rates = {a: float(rates[a]) for a in agents}
        self.unit = unit_s
        self.gens = gens  # one generator per owner (its own clock)
        self.next_tick = {a: self._gap(a) for a in agents}
        self.outstanding: set[int] = set()
        self.retired: set[int] = set()
        self.dropped = 0

    def _gap(self, a: int) -> float:
        return float(self.gens[a].standard_exponential()) / self.rates[a] * self.unit

    def _live(self) -> list[int]:
        return [a for a in self.agents if a not in self.retired]

    def due_requests(self, now: float) -> list[tuple[int, float]]:
        """owner_request: owners whose clock ticked and may ask now -> [(owner, tick time)]."""
        out = []
        for a in self._live():
            if a in self.outstanding:
                if self.next_tick[a] <= now:  # ticks while waiting are dropped; memoryless clock:
                    lost = (now - self.next_tick[a]) * self.rates[a] / self.unit
                    self.dropped += 1 + int(self.gens[a].poisson(lost))
                    self.next_tick[a] = now + self._gap(a)
            elif self.next_tick[a] <= now:
                out.append((a, self.next_tick[a]))
                self.outstanding.add(a)
                self.next_tick[a] += self._gap(a)
        return out

    def time_to_next(self, now: float) -> float | None:
        """Seconds to the next tick of an owner that may request (None: nobody may)."""
        ticks = [self.next_tick[a] for a in self._live() if a not in self.outstanding]
        return min(ticks) - now if ticks else None

    def claim(self, now: float) -> int:
        """learner_broadcast: the ready owner with the earliest tick, or -1."""
        ready = [a for a in self._live() if self.next_tick[a] <= now]
        return min(ready, key=lambda a: self.next_tick[a]) if ready else -1

    def served_one(self, a: int, status: int, now: float) -> None:
        """served() for one owner answering all its rows alike (the live hot path)."""
        self.outstanding.discard(a)
        if status in (DECLINED, LAST_ANSWER):
            self.retired.add(a)
        if self.restart and self.next_tick[a] <= now:  # broadcast: restart after service
            self.next_tick[a] = now + self._gap(a)

    def served(self, owners: np.ndarray, status: np.ndarray, now: float) -> None:
        for a, s in zip(owners.tolist(), status.tolist(), strict=True):
            self.served_one(int(a), s, now)
