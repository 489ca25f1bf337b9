"""Personalised private peer-to-peer coordinate descent (seed 004): the p2p method in one package.

Its modules sit in different layers of mpi_dp (tests/test_layers.py maps each one to its layer
and checks their imports like those of the layer's own package):

method entry (the methods layer):
    method              the method (class P2P, METHOD) and its job keys: set-up, settings,
                        outputs, table, figures
                        (registered in mpi_dp/methods/__init__.py as mpi_dp.p2p.method)
algorithm (the algorithms layer):
    coordinate_descent  Algorithms 1 / 2: the peers' wake-ups, Theorem-1 budgets, the serial
                        simulator, the replay in conflict-free rounds and the live clocks
    peer_data           the peers' data as one rank sees it: graph, records, validation share
    driver              the drivers under MPI: hosted problem, evaluation-only reference, CD
                        runs, the baselines' runs
    evaluation          evaluation-only metrics (Q, gap, per-peer test metric, global test set)
    reference_cache     the on-disk cache of the evaluation-only reference
    baselines           gossip ADMM and the local-DP baseline
model math (the models layer; NumPy/SciPy, no MPI):
    objective           objective (2): Problem, local losses and gradients, the graph term
    grad_scratch        objective's local gradient with reused scratch arrays (the same bits)
    reference           reference solutions: local models, Theta* and Q*, model propagation
                        (PETSc optional; its distributed KSP solve is the one use of MPI)
analysis (the analysis layer):
    report              text, CSV rows and figures of p2p results

Nothing is imported here: importing one module does not import the others.
"""
