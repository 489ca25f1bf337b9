"""mpi_dp.comm"""
