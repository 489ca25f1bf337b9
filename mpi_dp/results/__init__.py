"""mpi_dp.results"""
