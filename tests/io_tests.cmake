# Tests of the h5ddp_io layer (h5 handles, checkpoint plan, checkpoints, h5ddp-ckpt).
h5ddp_add_test_exe(h5_test h5_test.cpp)
target_link_libraries(h5_test PRIVATE h5ddp_io)
h5ddp_add_mpi_test(NAME h5 EXE h5_test RANKS 1 LABELS unit TIMEOUT 60)

h5ddp_add_test_exe(checkpoint_plan_test checkpoint_plan_test.cpp)
target_link_libraries(checkpoint_plan_test PRIVATE h5ddp_io)
h5ddp_add_mpi_test(NAME checkpoint_plan EXE checkpoint_plan_test RANKS 1 LABELS unit TIMEOUT 60)

h5ddp_add_test_exe(checkpoint_test checkpoint_test.cpp)
target_link_libraries(checkpoint_test PRIVATE h5ddp_io)
h5ddp_add_mpi_test(NAME checkpoint EXE checkpoint_test RANKS 1 2 4 LABELS unit TIMEOUT 180)
# Same round trips with transfers capped at 64 KiB: every tensor goes in many HDF5 calls, and ranks sharing a
# dataset must still make the same number of collective calls (the path taken by tensors > 1 GiB).
h5ddp_add_mpi_test(NAME checkpoint_small_transfers EXE checkpoint_test RANKS 2 4 LABELS unit TIMEOUT 180
  ARGS --gtest_filter=AllWorldSizes/*:*Corrupt*)
foreach(np 2 4)
  set_property(TEST checkpoint_small_transfers.np${np} APPEND PROPERTY ENVIRONMENT H5DDP_MAX_TRANSFER_BYTES=65536)
endforeach()

# h5dump, h5py and h5ddp-ckpt on a checkpoint written by 2 ranks.
add_executable(checkpoint_fixture_writer checkpoint_fixture_main.cpp)
target_link_libraries(checkpoint_fixture_writer PRIVATE h5ddp_io h5ddp_warnings)
if(TARGET h5ddp-ckpt)
  h5ddp_add_script_test(NAME ckpt_tool LABELS unit mpi TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_tool_test.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
endif()

h5ddp_add_test_exe(direct_read_test direct_read_test.cpp)
target_link_libraries(direct_read_test PRIVATE h5ddp_io)
h5ddp_add_mpi_test(NAME direct_read EXE direct_read_test RANKS 1 LABELS unit TIMEOUT 60)
