"""Agent graphs and time-varying doubly stochastic mixing (seed 003, spec §3). Pure NumPy, no MPI.

The graph type itself is mpi_dp.agent_graph.Graph (one for both peer methods), re-exported here.

The graph construction of both peer methods lives here (`make_graph`): dola's kinds and the
spellings shared with p2p's `p2p.graph` (`parse_graph_spec`: "shard", "knn:K", "complete",
"erdos_renyi[:p]", "random_geometric[:r]", an edge-list path). What a kind needs from the shard file
(its stored graph, public agent descriptors) the caller hands in as arrays or loaders, so this
module reads no file but an edge list.

Every rank builds the same static base graph G from the shared seed; what varies per round is the
active edge set E_t, decided by a counter-based hash of (seed, t, i, j) that both endpoints of an
edge compute alike without a message, plus a forced refresh that makes an edge idle for N - 1
rounds active in the next (so the union over any N consecutive rounds is G, connected:
Assumption 2(4)). The weights of A_t are Metropolis-Hastings weights that each agent computes for
its own row from public degrees; A_t is symmetric and row-stochastic, hence doubly stochastic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from mpi_dp import rng
from mpi_dp.agent_graph import Graph  # the one graph type (re-exported: dola's code names tp.Graph)
from mpi_dp.errors import JobError

#: mean degree of the random geometric graphs standing in for the paper's T1/T2/T3
RGG_DEGREE = {"sparse": 4.0, "medium": 10.0, "dense": 24.0}
KINDS = (*RGG_DEGREE, "geometric", "ring", "grid", "complete", "erdos_renyi", "from_file")
#: kinds spelled "kind" or "kind:param" by the peer methods' graph keys (besides KINDS; any other
#: value, or "file:PATH", is an edge-list path)
SPEC_KINDS = ("shard", "knn", "complete", "erdos_renyi", "random_geometric")
#: what each spelling means, for the keys' help and errors
SPELLINGS = ("'shard' (the graph stored in the shard file), 'knn:K' (K nearest neighbours on the "
             "shard's public /public/agent_descriptors), 'complete', 'erdos_renyi:p' (edge "
             "probability p; 'erdos_renyi': 2 ln(m)/m), 'random_geometric' (unit square, mean "
             "degree ~10) or 'random_geometric:r' (radius r), or an edge-list path ('i j [w]' per "
             "line; 'file:PATH' for any path)")
#: mean degree of the plain "random_geometric" spelling (dola's 'medium', the paper's T2)
RGG_SPEC_DEGREE = 10.0
ACTIVATIONS = ("hash", "fixed")
WEIGHTS = ("mh_static", "mh_active", "max_degree")
#: resampling attempts before a random graph kind gives up on connectivity
MAX_ATTEMPTS = 200


# -- generators --------------------------------------------------------------------------------
def _pairs_within(points: np.ndarray, r: float) -> np.ndarray:
    pairs = cKDTree(points).query_pairs(r, output_type="ndarray")
    return np.sort(pairs.astype(np.int64), axis=1)


#: relative distance from the crossing radius beyond which `geometric`'s bisection takes the
#: side from the sorted pair distances; nearer, it counts pairs with the k-d tree as it always did
#: (the two distance computations differ by rounding only, many orders below this margin)
BISECT_MARGIN = 1e-7
#: `geometric` rejects an attempt whose graph at d* (1 + CONNECT_MARGIN) is not connected before
#: bisecting: the bisected radius ends within BISECT_MARGIN of d*, so its graph is a subgraph of
#: that one (most attempts at 10,000 agents are rejected; the bisection's k-d tree counts were
#: most of the time of building the graph)
CONNECT_MARGIN = 1e-5


def _kth_pair_distance(tree: cKDTree, pts: np.ndarray, k: int
                       ) -> tuple[float, np.ndarray, np.ndarray, float]:
    """The k-th smallest distance between two of the points (k >= 1): the radius at which the
    number of pairs within reaches k; with the pairs found within the searched radius, their
    distances and that radius (inf and empty when there are fewer than k pairs)."""
    m = len(pts)
    if k > m * (m - 1) // 2:
        return math.inf, np.zeros((0, 2), dtype=np.int64), np.zeros(0), 0.0
    r = math.sqrt(4.0 * k / (math.pi * max(1, m * (m - 1)))) + 1e-12  # ~2k pairs if uniform
    while True:
        pairs = tree.query_pairs(r, output_type="ndarray")
        if len(pairs) >= k or r > 2.0:
            break
        r *= 2.0
    d = np.sqrt(((pts[pairs[:, 0]] - pts[pairs[:, 1]]) ** 2).sum(axis=1))
    return float(np.partition(d, k - 1)[k - 1]), pairs, d, r


def _connected_within(m: int, pairs: np.ndarray, d: np.ndarray, searched: float,
                      pts: np.ndarray, r: float) -> bool:
    """Whether the graph of the pairs at distance <= r is connected (from the pairs already
    found within `searched` when r is inside it)."""
    if r > searched:
        e = _pairs_within(pts, r)
    else:
        e = pairs[d <= r]
    if m <= 1:
        return True
    adj = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(m, m))
    return csgraph.connected_components(adj, directed=False)[0] == 1


def geometric(m: int, degree: float, seed: int, kind: str = "geometric") -> Graph:
    """Random geometric graph in the unit square with the radius bisected so the mean degree is
    the first >= `degree`; positions are resampled (attempt a = 0, 1, ...) until it is connected."""
    if not 0 < degree <= m - 1:
        raise JobError(f"graph: a mean degree of {degree:g} is impossible with {m} agents")
    for attempt in range(MAX_ATTEMPTS):
        pts = rng.stream(seed, "graph", 0, attempt).random((m, 2))
        tree = cKDTree(pts)
        lo, hi = 0.0, math.sqrt(2.0)
        target = degree * m / 2.0  # edges
        d_star, pairs, dist, searched = _kth_pair_distance(tree, pts, math.ceil(target))
        if math.isfinite(d_star) and not _connected_within(
                m, pairs, dist, searched, pts, d_star * (1.0 + CONNECT_MARGIN)):
            continue  # the bisected radius is below this one: not connected either
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if abs(mid - d_star) > BISECT_MARGIN * d_star:  # far from the crossing: its side
                enough = mid > d_star
            else:  # count_neighbors counts ordered pairs including i == i
                enough = (tree.count_neighbors(tree, mid) - m) / 2 >= target
            if enough:
                hi = mid
            else:
                lo = mid
        g = Graph(m, _pairs_within(pts, hi), kind, positions=pts,
                  info={"seed": seed, "radius": hi, "target_degree": degree, "attempt": attempt})
        if g.is_connected():
            return g
    raise JobError(f"graph: no connected random geometric graph with mean degree {degree:g} on "
                   f"{m} agents in {MAX_ATTEMPTS} attempts (seed {seed}); raise the degree (e.g. "
                   "kind 'medium' or 'dense')")


def ring(m: int) -> Graph:
    if m < 2:
        return Graph(m, np.zeros((0, 2)), "ring")
    i = np.arange(m)
    e = np.sort(np.stack([i, (i + 1) % m], axis=1), axis=1)
    return Graph(m, e, "ring")


def grid(m: int) -> Graph:
    """rows x cols = m lattice with 4-neighbours, rows the largest divisor of m <= sqrt(m)."""
    rows = max(r for r in range(1, math.isqrt(m) + 1) if m % r == 0)
    cols = m // rows
    idx = np.arange(m).reshape(rows, cols)
    e = np.concatenate([np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], axis=1),
                        np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], axis=1)])
    return Graph(m, e, "grid", info={"rows": rows, "cols": cols})


def complete(m: int) -> Graph:
    i, j = np.triu_indices(m, k=1)
    return Graph(m, np.stack([i, j], axis=1), "complete")


#: agent pairs per block of `erdos_renyi`'s draws (32 MiB of uniforms): O(m^2) time in
#: vectorised blocks, memory for the kept edges only
ER_PAIRS_BLOCK = 2**22


def _upper_pairs(m: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (i, j), i < j, of rows a..b-1 in the row-major order of np.triu_indices(m, 1)."""
    rows = np.arange(a, b, dtype=np.int64)
    counts = m - 1 - rows
    first = np.cumsum(counts) - counts
    i = np.repeat(rows, counts)
    j = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first - rows - 1, counts)
    return i, j


def _er_edges(m: int, p: float, g: np.random.Generator) -> np.ndarray:
    """The pairs with u < p, u one uniform per pair of np.triu_indices(m, 1) in order, drawn by
    blocks of rows (the same numbers as one draw of all: doubles are chunk-invariant)."""
    out, a = [], 0
    while a < m - 1:
        b, pairs = a, 0
        while b < m - 1 and (b == a or pairs + (m - 1 - b) <= ER_PAIRS_BLOCK):
            pairs += m - 1 - b
            b += 1
        i, j = _upper_pairs(m, a, b)
        keep = g.random(i.size) < p
        out.append(np.stack([i[keep], j[keep]], axis=1))
        a = b
    return np.concatenate(out) if out else np.zeros((0, 2), dtype=np.int64)


def erdos_renyi(m: int, p: float, seed: int) -> Graph:
    if not 0 < p <= 1:
        raise JobError(f"graph: erdos_renyi needs an edge probability p in (0, 1], got {p}")
    for attempt in range(MAX_ATTEMPTS):
        g = Graph(m, _er_edges(m, p, rng.stream(seed, "graph", 0, attempt)), "erdos_renyi",
                  info={"seed": seed, "p": p, "attempt": attempt})
        if g.is_connected():
            return g
    raise JobError(f"graph: no connected Erdos-Renyi graph G({m}, {p:g}) in {MAX_ATTEMPTS} "
                   f"attempts (seed {seed}); raise p (connectivity needs p > ln(m)/m = "
                   f"{math.log(max(m, 2)) / m:.3g})")


def from_file(path: str | Path, m: int) -> Graph:
    """Edge list 'i j' or 'i j w' per line (agents 0..m-1, '#' comments; a pair listed twice or
    in both directions is one edge). A weight w > 0 makes the graph weighted (a line without one
    weighs 1); without any weight the graph is unweighted."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise JobError(f"graph file {p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise JobError(f"graph file {p} is not a text edge list (binary content); give a text "
                       "file with one edge 'i j [w]' per line")
    lines = text.splitlines()
    pairs: list[tuple[int, int]] = []
    weights: list[float] = []
    weighted = False
    for no, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            i, j = int(parts[0]), int(parts[1])
            w = float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            raise JobError(f"graph file {p}, line {no}: expected two agent ids and an optional "
                           f"weight 'i j [w]', got {line[:80]!r}") from None
        if not (0 <= i < m and 0 <= j < m):
            raise JobError(f"graph file {p}, line {no}: agent ids must be in 0..{m - 1} (the job "
                           f"has {m} agents), got {i} {j}")
        if i == j:
            raise JobError(f"graph file {p}, line {no}: self-loop {i} {j}")
        if not (math.isfinite(w) and w > 0):
            raise JobError(f"graph file {p}, line {no}: weight {parts[2]} must be finite and > 0")
        weighted |= len(parts) == 3
        pairs.append((min(i, j), max(i, j)))
        weights.append(w)
    edges = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    if not weighted:
        return Graph(m, edges, "from_file", info={"path": str(p)})
    seen: dict[tuple[int, int], float] = {}
    for pair, w in zip(pairs, weights, strict=True):
        if seen.setdefault(pair, w) != w:
            raise JobError(f"graph file {p}: edge {pair[0]} {pair[1]} is listed with weights "
                           f"{seen[pair]:g} and {w:g}; give it one weight")
    keys = list(seen)
    return Graph(m, np.array(keys, dtype=np.int64).reshape(-1, 2), "from_file",
                 info={"path": str(p)}, weights=np.array([seen[k] for k in keys]))


def to_file(graph: Graph, path: str | Path) -> Path:
    """Write `graph` as the edge list `from_file` reads ('i j' or 'i j w', repr of the weight:
    a round trip gives the same edges and weights)."""
    p = Path(path)
    rows = (f"{i} {j}" if graph.weights is None else f"{i} {j} {float(graph.weights[k])!r}"
            for k, (i, j) in enumerate(graph.edges.tolist()))
    p.write_text(f"# {graph.kind} graph on {graph.m} agents, {len(graph.edges)} edges\n"
                 + "".join(r + "\n" for r in rows))
    return p


#: distances per block of `knn` (64 MiB of float64): O(m^2 d) time, O(m) memory per row
KNN_BLOCK = 2**23


def knn(descriptors: np.ndarray, k: int) -> Graph:
    """The k-nearest-neighbour graph of the rows of `descriptors` (m, d): {i, j} is an edge if j
    is among i's k nearest rows (Euclidean, ties to the lower id) or i among j's, so every
    agent has degree >= k. Deterministic: no random draw."""
    X = np.asarray(descriptors, dtype=np.float64)
    m = X.shape[0]
    if not 1 <= k <= m - 1:
        raise JobError(f"graph: knn:{k} needs 1 <= K <= m - 1 = {m - 1} (the job has {m} agents)")
    if not np.all(np.isfinite(X)):
        raise JobError("graph: knn: the agent descriptors hold NaN or inf values")
    rows = []
    step = max(1, KNN_BLOCK // m)
    for a in range(0, m, step):  # squared distances by blocks of rows (each row alike)
        blk = X[a:a + step]
        d2 = cdist(blk, X, "sqeuclidean")
        d2[np.arange(len(blk)), np.arange(a, a + len(blk))] = np.inf  # never oneself
        near = np.argsort(d2, axis=1, kind="stable")[:, :k]  # ties: the lower id first
        rows.append(np.stack([np.repeat(np.arange(a, a + len(blk)), k), near.ravel()], axis=1))
    e = np.sort(np.concatenate(rows), axis=1)
    return Graph(m, e, "knn", info={"k": int(k)})


def geometric_radius(m: int, radius: float, seed: int) -> Graph:
    """Random geometric graph of radius `radius` in the unit square; positions are resampled
    (attempt a = 0, 1, ...) until it is connected."""
    if not radius > 0:
        raise JobError(f"graph: random_geometric needs a radius r > 0, got {radius}")
    for attempt in range(MAX_ATTEMPTS):
        pts = rng.stream(seed, "graph", 0, attempt).random((m, 2))
        g = Graph(m, _pairs_within(pts, radius), "random_geometric", positions=pts,
                  info={"seed": seed, "radius": radius, "attempt": attempt})
        if g.is_connected():
            return g
    raise JobError(f"graph: no connected random geometric graph of radius {radius:g} on {m} "
                   f"agents in {MAX_ATTEMPTS} attempts (seed {seed}); raise r (connectivity "
                   f"needs about r > sqrt(ln(m) / (pi m)) = "
                   f"{math.sqrt(math.log(max(m, 2)) / (math.pi * m)):.3g})")


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """A parsed graph spelling: `kind` (one of KINDS or SPEC_KINDS, or 'from_file' for a path)
    and its parameter (knn's K, erdos_renyi's p, random_geometric's r; None: the default)."""

    kind: str
    param: float | None = None
    path: str | None = None


def parse_graph_spec(value: str, *, legacy: tuple[str, ...] = ()) -> GraphSpec:
    """The spelling `value` of a graph key: a kind of `legacy` (dola's own kinds, taken as they
    are), 'shard', 'complete', 'knn:K', 'erdos_renyi[:p]', 'random_geometric[:r]', 'file:PATH'
    or a path. ValueError (what is wrong, the spellings) otherwise."""
    v = str(value).strip()
    if v in legacy:
        return GraphSpec(v)
    if v.startswith("file:"):
        if not v[5:]:
            raise ValueError("'file:' needs a path, e.g. 'file:graphs/peers.txt'")
        return GraphSpec("from_file", path=v[5:])
    kind, _, arg = v.partition(":")
    if kind in ("shard", "complete"):
        if arg:
            raise ValueError(f"{kind!r} takes no parameter, got {v!r}")
        return GraphSpec(kind)
    if kind == "knn":
        try:
            k = int(arg)
        except ValueError:
            raise ValueError(f"knn needs its number of neighbours K as 'knn:K' (e.g. 'knn:10'), "
                             f"got {v!r}") from None
        if k < 1:
            raise ValueError(f"knn:K needs K >= 1, got {v!r}")
        return GraphSpec("knn", float(k))
    if kind in ("erdos_renyi", "random_geometric"):
        if not arg:
            return GraphSpec(kind)
        try:
            x = float(arg)
        except ValueError:
            x = math.nan
        what = ("p: an edge probability in (0, 1]" if kind == "erdos_renyi"
                else "r: a radius > 0")
        if not (x > 0 and (x <= 1 or kind == "random_geometric") and math.isfinite(x)):
            raise ValueError(f"{kind}:{what[0]} needs {what}, got {v!r}")
        return GraphSpec(kind, x)
    if ("/" in v or "." in v or Path(v).exists()) and ":" not in kind:
        return GraphSpec("from_file", path=v)
    raise ValueError(f"unknown graph {v!r}; use {SPELLINGS}"
                     + (f", or one of {', '.join(legacy)}" if legacy else ""))


Loader = Callable[[], Any]


def make_graph(kind: str, m: int, seed: int, *, degree: float | None = None,
               p: float | None = None, path: str | None = None,
               descriptors: np.ndarray | Loader | None = None,
               stored: Graph | Loader | None = None) -> Graph:
    """The base graph of a job, built alike on every rank from the seed; raises JobError if it
    is not connected. `kind`: one of KINDS (dola's, with `degree`, `p`, `path`) or a spelling of
    `parse_graph_spec`. `descriptors` (m, d), for 'knn:K', and `stored`, the shard file's own
    graph for 'shard' (a Graph or its (edges, weights)), may be loaders called only when the
    kind needs them."""
    if m < 1:
        raise JobError("graph: need at least one agent")
    try:
        spec = parse_graph_spec(kind, legacy=KINDS)
    except ValueError as e:
        raise JobError(f"graph: {e}") from None
    kind = spec.kind
    hint = ""
    if spec.param is not None or kind in ("shard", "knn", "random_geometric"):
        g = _spelled(spec, m, seed, descriptors, stored)
        hint = {"knn": f"; raise K (e.g. knn:{2 * int(spec.param or 1)})",
                "shard": "; fix the shard file's graph or choose another"}.get(kind, "")
    elif kind in RGG_DEGREE:
        g = geometric(m, min(RGG_DEGREE[kind], m - 1), seed, kind) if m > 1 else ring(m)
    elif kind == "geometric":
        g = geometric(m, float(degree if degree is not None else 4.0), seed)
    elif kind == "ring":
        g = ring(m)
    elif kind == "grid":
        g = grid(m)
    elif kind == "complete":
        g = complete(m)
    elif kind == "erdos_renyi":
        g = erdos_renyi(m, float(p if p is not None else min(1.0, 2 * math.log(max(m, 2)) / m)),
                        seed)
    elif kind == "from_file":
        path = spec.path or path
        if not path:
            raise JobError("graph: kind 'from_file' needs a path to an edge list")
        g = from_file(path, m)
        hint = "; add edges to the file"
    else:
        raise JobError(f"graph: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    if not g.is_connected():
        n, labels = csgraph.connected_components(g.adjacency, directed=False)
        alone = np.flatnonzero(labels != labels[0])[:5].tolist()
        raise JobError(f"graph ({g.kind}, {m} agents) is not connected: {n} components (e.g. "
                       f"agent(s) {alone} cannot reach agent 0); the peer methods need a "
                       f"connected graph (DOLA's Assumption 2){hint}")
    return g


def _spelled(spec: GraphSpec, m: int, seed: int, descriptors: Any, stored: Any) -> Graph:
    """The graph of a spelling with a parameter or a shard input (see `make_graph`)."""
    if spec.kind == "shard":
        if stored is None:
            raise JobError("graph: 'shard' needs the shard file's stored graph")
        got = stored() if callable(stored) else stored
        if isinstance(got, Graph):
            return got
        edges, weights = got  # the shard file's (E, 2) pairs i < j and their weights
        if len(edges) and int(np.max(edges)) >= m:
            raise JobError(f"graph: the shard file's graph links agent {int(np.max(edges))} but "
                           f"the job has {m} agents; 'shard' needs one agent per shard owner")
        return Graph(m, edges, "shard", info={"source": "the shard file's stored graph"},
                     weights=weights)
    if spec.kind == "knn":
        if descriptors is None:
            raise JobError("graph: 'knn:K' needs public agent descriptors")
        d = np.asarray(descriptors() if callable(descriptors) else descriptors, dtype=np.float64)
        if d.ndim != 2 or d.shape[0] < m:
            raise JobError(f"graph: knn needs one descriptor row per agent ({m}), got shape "
                           f"{d.shape}")
        return knn(d[:m], int(spec.param or 0))
    if spec.kind == "random_geometric":
        if spec.param is not None:
            return geometric_radius(m, float(spec.param), seed)
        if m < 2:
            return ring(m)
        return geometric(m, min(RGG_SPEC_DEGREE, m - 1), seed, "random_geometric")
    if spec.kind == "erdos_renyi":
        return erdos_renyi(m, float(spec.param), seed)  # type: ignore[arg-type]
    raise JobError(f"graph: unknown kind {spec.kind!r}")


# -- activation: which edges are on in round t --------------------------------------------------
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + _M1
    z = (z ^ (z >> np.uint64(30))) * _M2
    z = (z ^ (z >> np.uint64(27))) * _M3
    return z ^ (z >> np.uint64(31))


def edge_uniforms(seed: int, t: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """u(seed, t, i, j) in [0, 1) for edges {i, j} given as lo = min, hi = max."""
    with np.errstate(over="ignore"):
        h = splitmix64(np.full(np.shape(lo), np.uint64(seed) ^ splitmix64(np.uint64(t))))
        h = splitmix64(h ^ np.asarray(lo, dtype=np.uint64))
        h = splitmix64(h ^ (np.asarray(hi, dtype=np.uint64) << np.uint64(1)))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


class EdgeActivation:
    """Active/idle state of a set of edges over rounds t = 0, 1, 2, ... (called in order).

    `hash`: edge {i, j} is active at t iff u(seed, t, i, j) < p_act, or if it was idle for the
    last N - 1 rounds (forced refresh). `fixed`: every edge every round. Both endpoints of an edge
    (on any rank) hold the same state because it depends only on (seed, t, i, j) and the edge's
    own history.
    """

    def __init__(self, edges: np.ndarray, mode: str = "hash", p_act: float = 0.5,
                 window: int = 10, seed: int = 0) -> None:
        if mode not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {mode!r}")
        if not 0 < p_act <= 1 or window < 1:
            raise ValueError("need 0 < p_act <= 1 and window N >= 1")
        e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        self.lo, self.hi = e[:, 0].copy(), e[:, 1].copy()
        self.mode, self.p_act, self.window, self.seed = mode, float(p_act), int(window), int(seed)
        self.last = np.full(len(e), -1, dtype=np.int64)
        self.t = 0

    def step(self) -> np.ndarray:
        """The active mask of round self.t, then advance to the next round."""
        t = self.t
        if self.mode == "fixed":
            act = np.ones(self.lo.size, dtype=bool)
        else:
            act = edge_uniforms(self.seed, t, self.lo, self.hi) < self.p_act
            act |= (t - self.last) >= self.window
        self.last[act] = t
        self.t = t + 1
        return act


# -- weights: each agent's own row of A_t -------------------------------------------------------
class MixingRows:
    """Rows of A_t for a set of agents `rows_of`, from their neighbours (ascending ids).

    The block holds, per agent a of `agents`, its neighbours' positions in CSR (`indptr`,
    `nbr`) and the index of each edge in the tracked edge set (`eid`). `weights(active)` returns
    (a_self (k,), a_nbr (nnz,)) for the active mask of the tracked edges. For `mh_active` the
    tracked edges must include every edge of every neighbour (2-hop); `deg_active` maps each
    agent (global id) to the tracked edges incident to it.
    """

    def __init__(self, graph: Graph, agents: np.ndarray, tracked: np.ndarray, weights: str) -> None:
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        self.weights = weights
        self.agents = np.asarray(agents, dtype=np.int64)
        a = graph.adjacency
        deg = graph.degrees
        self.indptr = np.concatenate([[0], np.cumsum(deg[self.agents])]).astype(np.int64)
        self.nbr = np.concatenate([a.indices[a.indptr[i]:a.indptr[i + 1]] for i in self.agents]
                                  ).astype(np.int64) if len(self.agents) else np.zeros(0, np.int64)
        self.owner = np.repeat(np.arange(len(self.agents)), np.diff(self.indptr))
        i = self.agents[self.owner]
        tracked_key = tracked[:, 0] * graph.m + tracked[:, 1]
        want = np.minimum(i, self.nbr) * graph.m + np.maximum(i, self.nbr)
        self.eid = np.searchsorted(tracked_key, want).astype(np.int64)
        if want.size and not np.array_equal(tracked_key[np.minimum(self.eid, len(tracked) - 1)],
                                            want):
            raise ValueError("tracked edges do not cover the agents' edges")
        d_max = int(deg.max(initial=0))
        if weights == "mh_static":
            self.static = 1.0 / (1.0 + np.maximum(deg[i], deg[self.nbr]))
        elif weights == "max_degree":
            self.static = np.full(self.nbr.size, 1.0 / (1.0 + d_max))
        else:
            self.m = graph.m
            self.tracked = tracked
        self.eta = 1.0 / (1.0 + d_max)

    def weights_for(self, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a_self, a_nbr) of round t; a_self = 1 - the neighbour weights summed in ascending
        neighbour order (the same float operations on every rank)."""
        on = active[self.eid]
        if self.weights == "mh_active":
            d = np.bincount(self.tracked[active].ravel(), minlength=self.m)
            i = self.agents[self.owner]
            w = 1.0 / (1.0 + np.maximum(d[i], d[self.nbr]))
        else:
            w = self.static
        a_nbr = np.where(on, w, 0.0)
        a_self = np.ones(len(self.agents))
        acc = np.zeros(len(self.agents))
        deg = np.diff(self.indptr)
        for k in range(int(deg.max(initial=0))):
            rows = np.flatnonzero(deg > k)
            acc[rows] += a_nbr[self.indptr[rows] + k]
        a_self -= acc
        return a_self, a_nbr


def tracked_edges(graph: Graph, agents: np.ndarray, two_hop: bool) -> np.ndarray:
    """The edges whose activation a holder of `agents` must track: theirs (and, for `mh_active`,
    their neighbours'), as rows of graph.edges, sorted."""
    nodes = np.asarray(agents, dtype=np.int64)
    if two_hop and nodes.size:
        a = graph.adjacency
        nodes = np.union1d(nodes, np.concatenate([a.indices[a.indptr[i]:a.indptr[i + 1]]
                                                  for i in nodes]))
    mask = np.isin(graph.edges[:, 0], nodes) | np.isin(graph.edges[:, 1], nodes)
    return graph.edges[mask]


def mixing_constants(m: int, eta: float, window: int) -> dict[str, float]:
    """Lemma 3: |Phi(k, s)_ij - 1/m| <= theta beta^(k - s)."""
    q = 1.0 - eta / (4.0 * m * m)
    return {"eta": eta, "N": window, "theta": q ** -2, "beta": q ** (1.0 / window)}


def dense_matrix(graph: Graph, active: np.ndarray, weights: str) -> np.ndarray:
    """The whole A_t (m x m) assembled from every agent's own row: for tests and small checks."""
    rows = MixingRows(graph, np.arange(graph.m), graph.edges, weights)
    a_self, a_nbr = rows.weights_for(active)
    A = np.zeros((graph.m, graph.m))
    A[rows.agents[rows.owner], rows.nbr] = a_nbr
    A[np.arange(graph.m), np.arange(graph.m)] = a_self
    return A
