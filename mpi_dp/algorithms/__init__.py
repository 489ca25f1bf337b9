"""mpi_dp.algorithms"""
