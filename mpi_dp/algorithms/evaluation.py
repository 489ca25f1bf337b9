"""One evaluator interface: what every method's evaluation-only metrics come from.

An evaluator reads un-noised functions of the owners' data (losses, objective values, error
rates, regret) or the agents' clean iterates, which the private protocol never releases. The
program's privacy promise allows exactly this through paths marked evaluation-only (DESIGN.md,
"Promises"), so every evaluator keeps this contract:

- it is never part of the private protocol: nothing it computes feeds back into a model, a
  release, a noise stream or a ledger, and a run gives the same models with or without it;
- what it returns is written only as evaluation-only output (metrics, reference/*, attributes
  saying so), never sent to an owner or a peer;
- its collectives are the same on every rank (it may gather per-agent values, always summed in
  agent order, so the numbers do not depend on the layout), and it returns its values on the
  reporting rank (rank 0: the learner, the server or the graph's root) and None elsewhere.

Implementations (`record(...)` and `final(...)`; their arguments differ by method):

- `common.Oracle` (sync_star, async_star): record(thetas, rows=None, extra_local=None) ->
  {'objective', utility metrics of thetas[rows], 'extra'}; final() -> None (the star methods'
  final evaluation is the reference, `common.reference_quantities`, computed before the run);
- `async_star.GramEvaluator` (async_star, squared loss; learner-only, no collective after its
  construction): record(thetas) -> {'objective', 'train_mse'}; final(isolated, f_star) ->
  {'psi_isolated'};
- `dola.Evaluation` (dola, around `dola.collect`): record(block) -> the round's metrics (and
  the models under '_w_bar', '_w_hat', which are outputs, not metrics); final() -> {'w_hat',
  'w_bar'}, the last record's models;
- `p2p.evaluation.Evaluator` (p2p): record(block) -> {'Q', 'test_metric', ...}; final(block,
  val=None) -> the final models and their metrics, with `val` as val_metric. The validation
  score itself comes from `validation(block, release_clip)`, kept apart because under a
  private selection (`release_clip` given) it is a release made by each peer, not an
  evaluation.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Evaluator(Protocol):
    """Evaluation-only metrics of a run (see the module's contract).

    `record(...)`: at a record (collective where the evaluator gathers), the metrics of the
    current models, metric name -> value ((R,) per run, or a scalar per record), on the
    reporting rank; None elsewhere, and None where nothing is evaluated (e.g. an audit).
    `final(...)`: at the end of the run, the evaluation-only outputs the run adds once (final
    metrics, reference values), on the reporting rank; None elsewhere or when there are none.
    """

    def record(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None: ...

    def final(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None: ...
