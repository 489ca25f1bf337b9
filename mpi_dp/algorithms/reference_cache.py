"""On-disk cache of the star methods' evaluation-only reference (`common.Reference`: theta*, f*,
the isolated optima and their psi, the trivial baselines and theta*'s utility).

The reference of a configuration is a deterministic function of the participants' records (the
first n_i records of owners 0..N-1 of the shard file), the evaluation set, the objective and the
code, and it can take a short job most of its start-up (at 1,000 owners x 500 records, logistic:
about a hundred passes over every record for theta*, one L-BFGS solve per isolated owner, one
evaluation of every isolated optimum over every record). A sweep of jobs on one shard computes
it once: the learner keys an entry by a SHA-256 over

* the shard file's content digest (its root attribute content_sha256; a file written before
  that attribute existed: the SHA-256 of its bytes) and the records taken (the n vector), the
  owner count, p and whether the run evaluates (an audit records no utility);
* the objective: loss, lam and theta_max (by their exact bits), the solver asked for and
  reference.isolated;
* the code that computes it (the source of models/reference.py, models/linear.py,
  algorithms/common.py, algorithms/agent_block.py and this module) and what may change its
  rounding: numpy, scipy (petsc4py for solver = 'petsc') versions, Python, the machine and the
  BLAS thread settings.

Entries reuse p2p's format (`mpi_dp.p2p.reference_cache`: an .npz of exact float64 bytes with its
key and a digest of its values, written atomically, ignored and recomputed when it does not
load or match), so a cached reference is bit for bit the computed one and results are identical
with and without the cache. The reference is rank-invariant (sums in agent order), so the rank
count is not part of the key.

Where: $MPI_DP_REFERENCE_CACHE names the folder, or 'off' disables the cache; unset ('auto'):
$MPI_DP_CACHE/star_reference if MPI_DP_CACHE is set, else ~/.cache/mpi_dp/star_reference.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..data import ShardFile
from ..data.shard_format import CONTENT_DIGEST
from ..p2p import reference_cache as store
from ..results import provenance

#: environment variable: the cache's folder, 'off' (no cache) or 'auto' (the default)
ENV = "MPI_DP_REFERENCE_CACHE"
#: bump when the entry format or the meaning of a key changes
FORMAT = "mpi_dp star reference cache v1"
#: modules whose code computes the reference: their source is part of every key
_CODE = ("models/reference.py", "models/linear.py", "algorithms/common.py",
         "algorithms/agent_block.py", "algorithms/reference_cache.py")
#: entry names of the Reference fields (utility values are stored as "utility.<name>")
_FIELDS = ("theta_star", "f_star", "theta_isolated", "psi_isolated", "solver")


def folder() -> Path | None:
    """The cache folder ($MPI_DP_REFERENCE_CACHE, see the module docstring); None: disabled."""
    spec = os.environ.get(ENV, "auto").strip()
    if spec == "off":
        return None
    if spec in ("", "auto"):
        root = os.environ.get(store.CACHE_ENV)
        return (Path(root) if root else Path.home() / ".cache" / "mpi_dp") / "star_reference"
    return Path(spec).expanduser()


def shard_digest(shard: ShardFile) -> str:
    """The shard file's content digest, else (older files) the SHA-256 of its bytes."""
    stored = shard.attrs.get(CONTENT_DIGEST)
    if isinstance(stored, str) and stored:
        return "content:" + stored
    return "file:" + provenance.sha256(shard.path)


def _code_digest(solver: str) -> str:
    """The star reference's code and what may change its rounding (store.code_digest; the
    petsc4py version where its solver runs)."""
    extra = {}
    if solver == "petsc":
        try:
            import petsc4py

            extra["petsc4py"] = str(petsc4py.__version__)
        except ImportError:
            extra["petsc4py"] = "none"
    return store.code_digest(FORMAT, _CODE, extra)


@dataclasses.dataclass(frozen=True)
class DiskCache:
    """The learner's handle on the cache for one shard file (folder None: disabled)."""

    folder: Path | None
    shard: str = ""

    @classmethod
    def for_shard(cls, shard: ShardFile, on_learner: bool) -> DiskCache:
        """The cache of `shard` (the file is digested on the learner only, where keys live)."""
        where = folder()
        if where is None or not on_learner:
            return cls(where if on_learner else None)
        return cls(where, shard_digest(shard))

    def key(self, *, loss: str, lam: float, theta_max: float, solver: str, isolated: int | None,
            n: list[int], n_agents: int, p: int, evalset: Any, evaluating: bool) -> str:
        """The entry key of one configuration's reference (see the module docstring)."""
        what = {"shard": self.shard, "loss": loss, "lam": float(lam).hex(),
                "theta_max": float(theta_max).hex(), "solver": solver,
                "isolated": "all" if isolated is None else str(int(isolated)),
                "n_agents": str(n_agents), "p": str(p), "evaluating": str(bool(evaluating)),
                "evalset": f"{evalset.kind}:{evalset.n}"}
        d = store.key_start(_code_digest(solver), what)
        return d.array("n", np.asarray(n, dtype=np.int64)).hexdigest()

    def load(self, key: str, n_agents: int, p: int) -> dict[str, Any] | None:
        """The entry of `key` as Reference fields (utility as a dict), or None."""
        if self.folder is None:
            return None
        path = store.entry_path(self.folder, key)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                names = [k[2:] for k in z.files if not k.startswith("__")]
        except Exception:  # noqa: BLE001 - a damaged entry is recomputed (store.load decides)
            names = []
        expect: dict[str, tuple[int, ...] | None] = {k: None for k in names
                                                      if k.startswith("utility.")}
        expect.update(theta_star=(p,), f_star=None, theta_isolated=None, psi_isolated=None,
                      solver=None)
        got = store.load(self.folder, key, expect)
        if got is None:
            return None
        iso, psi = got["theta_isolated"], got["psi_isolated"]
        if (not isinstance(iso, np.ndarray) or iso.shape != (n_agents, p)
                or not isinstance(psi, np.ndarray) or psi.shape != (n_agents,)
                or not isinstance(got["f_star"], float) or not isinstance(got["solver"], str)):
            return None
        fields = {k: got[k] for k in _FIELDS}
        fields["utility"] = {k.split(".", 1)[1]: got[k] for k in got if k.startswith("utility.")}
        return fields

    def store(self, key: str, fields: dict[str, Any]) -> Path | None:
        """Write a reference's fields (exact float64 bytes) as the entry of `key`; None when the
        folder cannot be written (the run goes on without the cache)."""
        if self.folder is None:
            return None
        flat = {k: fields[k] for k in _FIELDS}
        flat["f_star"] = float(flat["f_star"])
        flat.update({f"utility.{k}": float(v) for k, v in fields["utility"].items()})
        return store.store(self.folder, key, flat)
