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

Waiting is polite: a short spin on Iprobe, then sleeps that double up to MAX_SLEEP_S, so idle ranks
on oversubscribed cores leave the CPU to the ranks that compute (MPICH busy-polls in Recv).
"""

from __future__ import annotations

import os
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

#: answer(owners (m,), runs (m,), thetas (m, p)) -> (status (m,), responses (m, p))
AnswerFn = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
#: state() -> [(owner, checkpoint state), ...] of the owners hosted on a rank
StateFn = Callable[[], list[tuple[int, Any]]]


def wait_message(comm: MPI.Comm, source: int, tag: int, spin_s: float | None = None) -> MPI.Status:
    """Block until a matching message is pending; spin briefly, then sleep (polite under load)."""
    spin = SPIN_S if spin_s is None else spin_s
    st = MPI.Status()
    if comm.Iprobe(source, tag, st):
        return st
    t0 = time.perf_counter()
    nap = 1e-5
    while not comm.Iprobe(source, tag, st):
        if time.perf_counter() - t0 > spin:
            time.sleep(nap)
            nap = min(2 * nap, MAX_SLEEP_S)
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
        """Live owner_request: the next REQ in arrival order -> (host rank, owner, tick time)."""
        st = wait_message(self.comm, MPI.ANY_SOURCE, REQ)
        buf = recv_pending(self.comm, st)
        return st.Get_source(), int(buf[0]), float(buf[1])

    def poll(self, seq: int) -> list[tuple[int, int]]:
        """Live learner_broadcast: POLL every host; the CLAIMs (host, owner) in arrival order."""
        msg = np.array([float(seq)])
        for h in self.hosts:
            self.comm.Send([msg, MPI.DOUBLE], dest=h, tag=POLL)
        claims = []
        for _ in self.hosts:
            st = wait_message(self.comm, MPI.ANY_SOURCE, CLAIM)
            buf = recv_pending(self.comm, st)
            if int(buf[0]) != seq:
                raise ProtocolError(f"learner: CLAIM for poll {int(buf[0])} during poll {seq}")
            if buf[1] >= 0:
                claims.append((st.Get_source(), int(buf[1])))
        return claims

    def deny(self, host: int, seq: int) -> None:
        self.comm.Send([np.array([float(seq)]), MPI.DOUBLE], dest=host, tag=DENY)

    def stop_and_drain(self) -> np.ndarray:
        """STOP every host; discard late REQs until each host ACKs; returns their ACK payloads."""
        self.stop_hosts()
        acks = {}
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

    def serve_live(self, protocol: str, clocks: OwnerClocks, answer: AnswerFn) -> None:
        """Live host loop for `protocol`: owner_request or learner_broadcast, until STOP + ACK."""
        sends: list[tuple[MPI.Request, np.ndarray]] = []
        while True:
            st = MPI.Status()
            if protocol == "owner_request":
                got = self.comm.Iprobe(0, MPI.ANY_TAG, st)
                if not got:
                    now = self.now()
                    for a, tick in clocks.due_requests(now):
                        msg = np.array([float(a), tick])
                        sends.append((self.comm.Isend([msg, MPI.DOUBLE], dest=0, tag=REQ), msg))
                    wait = clocks.time_to_next(self.now())
                    if wait is None:  # every owner waits for service or is done: block politely
                        st = wait_message(self.comm, 0, MPI.ANY_TAG)
                    else:
                        time.sleep(min(max(wait, 0.0), MAX_SLEEP_S))
                        continue
            else:
                st = wait_message(self.comm, 0, MPI.ANY_TAG)
            buf = recv_pending(self.comm, st)
            tag = st.Get_tag()
            if tag == STOP:
                break
            if tag == QRY:
                owners, status = self._answer_query(buf, answer)
                clocks.served(owners, status, self.now())
            elif tag == POLL:
                a = clocks.claim(self.now())
                self.comm.Send([np.array([buf[0], float(a)]), MPI.DOUBLE], dest=0, tag=CLAIM)
            elif tag != DENY:
                raise ProtocolError(f"rank {self.rank}: unexpected {TAG_NAMES.get(tag, tag)}")
        MPI.Request.Waitall([r for r, _ in sends])
        self.comm.Send([np.array([float(clocks.dropped)]), MPI.DOUBLE], dest=0, tag=ACK)


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

    def served(self, owners: np.ndarray, status: np.ndarray, now: float) -> None:
        for a, s in zip(owners.tolist(), status.tolist(), strict=True):
            self.outstanding.discard(a)
            if s in (DECLINED, LAST_ANSWER):
                self.retired.add(a)
            if self.restart and self.next_tick[a] <= now:  # broadcast: restart after service
                self.next_tick[a] = now + self._gap(a)
