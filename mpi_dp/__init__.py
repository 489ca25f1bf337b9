"""mpi_dp: differentially private learning across data owners on MPI, results in HDF5."""

__version__ = "0.1.0"
