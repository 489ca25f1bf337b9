# mpi_dp: `make demo` and `make test` work on a fresh machine (Python 3.10+ with venv and a C compiler).
# They create .venv, install the package with MPI from PyPI wheels (mpi4py + the mpich wheel),
# then run. WITH_PETSC=1 also builds PETSc and petsc4py from source (first time about 20-30
# minutes, cached by pip afterwards; needs libopenblas-dev liblapack-dev, installed with apt-get
# when run as root).

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
MPIEXEC  := $(VENV)/bin/mpiexec
WITH_PETSC ?= 0
NP       ?= 4
# pytest-xdist workers of the serial tests (each test may start mpiexec; 0: one process)
TEST_WORKERS ?= 2
export OPENBLAS_NUM_THREADS := 1
export OMP_NUM_THREADS := 1
export PATH := $(abspath $(VENV))/bin:$(PATH)
# PETSc built against the mpich wheel's compiler wrappers, without Fortran (the wheel has none)
export PETSC_CONFIGURE_OPTIONS ?= --with-fc=0 --with-debugging=0 --with-x=0

STAMP := $(VENV)/.installed
PETSC_STAMP := $(VENV)/.petsc
# the oldest Python mpi_dp supports (pyproject.toml: requires-python)
MIN_PY := 3.10
# refuse a .venv of an unsupported Python, or an incomplete one made by another Python, before
# anything uses it: a failed first try with an old python3 leaves a .venv that every later try
# would reuse (a complete .venv of another supported Python, PYTHON=python3.12 once, is kept)
define VENV_CHECK
want=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || { \
  echo "make: PYTHON=$(PYTHON) does not run: set PYTHON to a Python $(MIN_PY) or newer"; exit 1; }; \
if ! $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < tuple(map(int, "$(MIN_PY)".split("."))))'; then \
  echo "make: mpi_dp needs Python $(MIN_PY) or newer; PYTHON=$(PYTHON) is $$want: run e.g. make $(or $(MAKECMDGOALS),demo) PYTHON=python3.12"; exit 1; fi; \
if [ -e $(VENV) ]; then \
  have=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || have="a Python that does not run"; \
  if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] < tuple(map(int, "$(MIN_PY)".split("."))))' 2>/dev/null \
     || { [ ! -e $(STAMP) ] && [ "$$have" != "$$want" ]; }; then \
    echo "make: $(VENV) was made by $$have, not by PYTHON=$(PYTHON) ($$want), and is not a complete install (a failed first try, or another Python): remove it with rm -rf $(VENV) (make clean also does, and removes results/ too), then run make $(or $(MAKECMDGOALS),demo) again"; exit 1; fi; fi
endef

.PHONY: demo test test-serial test-mpi lint bench bench-quick gpu-check venv venv-check petsc clean help

help:
	@echo "make demo    - set up .venv, run the demo job under mpiexec -n $(NP), print its outputs"
	@echo "make test    - set up .venv, run the serial tests and the MPI tests on 1, 2 and 4 ranks"
	@echo "               (WITH_PETSC=1 make test also builds petsc4py and tests the PETSc path)"
	@echo "               (serial tests on TEST_WORKERS=$(TEST_WORKERS) pytest-xdist workers; 0: one process)"
	@echo "make gpu-check - on a GPU node: the tests marked gpu (CuPy against NumPy) and"
	@echo "               benchmarks/gpu.py (GPU against the node's CPU cores), one table each;"
	@echo "               installs CUPY=$(CUPY) into .venv when CuPy is missing"
	@echo "make lint    - ruff (style) and mypy (types of mpi_dp/, configured in pyproject.toml)"
	@echo "make bench   - benchmarks/replicates.py, async_rate.py (mpiexec -n 3 and -n 9), admm_mnist.py"
	@echo "               (GEMM efficiency; prepares data/mnist.h5), scaling.py (small grid),"
	@echo "               dola_rounds.py (-n 2), p2p_wakeups.py (-n 2, 4, 8; needs data/movielens.h5)"
	@echo "make bench-quick - every benchmarks/*.py in its --quick mode (tests/test_benchmarks.py;"
	@echo "               make test runs it too): seconds each, no timing judged"

venv: venv-check $(STAMP) $(if $(filter 1,$(WITH_PETSC)),$(PETSC_STAMP))

venv-check:
	@$(VENV_CHECK)

$(STAMP): pyproject.toml | venv-check
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[mpich,test,fast]"
	touch $@

$(PETSC_STAMP): $(STAMP)
	@if ! ldconfig -p | grep -q libopenblas || ! test -e /usr/include/lapack.h; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev liblapack-dev; \
	  else echo "WITH_PETSC=1 needs libopenblas-dev and liblapack-dev (apt-get install them as root)"; exit 1; fi; fi
	@echo "building PETSc + petsc4py from source (first time about 20-30 minutes; pip caches it)"
	$(PY) -m pip install --quiet petsc petsc4py
	$(PY) -c "from mpi_dp.models.petsc_backend import load_petsc; print('PETSc', load_petsc().Sys.getVersion())"
	touch $@

petsc:
	$(MAKE) venv WITH_PETSC=1

data/demo_shards.h5: | $(STAMP)
	$(VENV)/bin/mpi-dp data synth --task regression --agents 3 --records 4000 --dim 10 \
	  --noise 0.5 --seed 1 --public 10000 --out $@

demo: venv data/demo_shards.h5
	$(MPIEXEC) -n $(NP) $(VENV)/bin/mpi-dp run jobs/demo.toml --overwrite
	@$(VENV)/bin/mpi-dp analyze results/demo.h5
	@echo
	@echo "result file (HDF5):"
	@echo "  $(abspath results/demo.h5)"
	@echo "figures (PNG):"
	@$(VENV)/bin/mpi-dp plot results/demo.h5 | sed 's|^|  $(CURDIR)/|'

test: venv lint test-serial test-mpi

# the serial tests over TEST_WORKERS pytest-xdist workers (the Slurm ones share one: one node)
test-serial: venv
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "not mpi" tests

# pytest-mpi: the collective tests run inside every rank (timeout: a hang fails instead of waiting)
test-mpi: venv
	@for n in 1 2 4; do \
	  echo "== MPI tests on $$n rank(s)"; \
	  timeout 900 $(MPIEXEC) -n $$n $(PY) -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests \
	    || exit 1; \
	done

# CuPy wheel for gpu-check (match the node's CUDA: cupy-cuda12x or cupy-cuda13x)
CUPY ?= cupy-cuda12x
GPU_BENCH_ARGS ?=

# the GPU tests and benchmark; without a GPU both say why and stop cleanly
gpu-check: venv
	@$(PY) -c "import cupy" 2>/dev/null || ! command -v nvidia-smi >/dev/null \
	  || $(PY) -m pip install --quiet "$(CUPY)" \
	  || echo "gpu-check: could not install $(CUPY); the gpu tests will say why they skip"
	$(PY) -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_backend.py
	$(PY) benchmarks/gpu.py $(GPU_BENCH_ARGS)

lint: venv
	$(VENV)/bin/ruff check mpi_dp tests benchmarks
	$(VENV)/bin/mypy

bench: venv
	$(PY) benchmarks/replicates.py
	$(MPIEXEC) -n 3 $(PY) benchmarks/async_rate.py
	$(MPIEXEC) -n 9 $(PY) benchmarks/async_rate.py --pings 500
	@test -f data/mnist.h5 || $(VENV)/bin/mpi-dp data prepare mnist --source ../shared/data \
	  --out data/mnist.h5
	$(PY) benchmarks/admm_mnist.py --no-loop
	$(PY) benchmarks/scaling.py --agents 16,1024 --ranks 1,2
	$(MPIEXEC) -n 2 $(PY) benchmarks/dola_rounds.py
	@if [ -f data/movielens.h5 ]; then for n in 2 4 8; do \
	  $(MPIEXEC) -n $$n $(PY) benchmarks/p2p_wakeups.py || exit 1; done; \
	else echo "benchmarks/p2p_wakeups.py skipped: no data/movielens.h5 (mpi-dp data prepare movielens)"; fi

# every benchmark in its --quick mode (tiny synthetic data, no file needed; no timing judged)
bench-quick: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/test_benchmarks.py

clean:
	rm -rf $(VENV) results .pytest_cache
