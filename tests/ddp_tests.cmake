# DDP layer tests (included from tests/CMakeLists.txt), and MpiComm's asynchronous progress modes.
h5ddp_add_test_exe(mpi_comm_async_test mpi_comm_async_test.cpp)
h5ddp_add_mpi_test(NAME mpi_comm_async EXE mpi_comm_async_test RANKS 1 2 4 LABELS unit TIMEOUT 60)

h5ddp_add_test_exe(bucketing_test bucketing_test.cpp)
target_link_libraries(bucketing_test PRIVATE h5ddp_ddp)
h5ddp_add_mpi_test(NAME bucketing EXE bucketing_test RANKS 1 LABELS unit TIMEOUT 60)

h5ddp_add_test_exe(ddp_test ddp_test.cpp)
target_link_libraries(ddp_test PRIVATE h5ddp_ddp)
h5ddp_add_mpi_test(NAME ddp EXE ddp_test RANKS 1 2 4 TIMEOUT 240)

if(H5DDP_WITH_CUDA)
  h5ddp_add_test_exe(nccl_comm_test nccl_comm_test.cpp)
  h5ddp_add_mpi_test(NAME nccl_comm EXE nccl_comm_test RANKS 1 2 LABELS gpu TIMEOUT 120)
endif()
