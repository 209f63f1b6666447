# Fault tests (issue 9) and async checkpoint tests (issue 8): label `faults`. Each test bounds its time;
# the Python drivers in tests/faults/ also bound every subprocess and count a hang as a failure.
set(H5DDP_FAULTS_PY ${CMAKE_CURRENT_SOURCE_DIR}/faults)

h5ddp_add_test_exe(faults_test faults_test.cpp)
target_link_libraries(faults_test PRIVATE h5ddp_io)
h5ddp_add_mpi_test(NAME faults_unit EXE faults_test RANKS 1 2 4 LABELS unit faults TIMEOUT 90)

add_executable(h5ddp_watchdog_stall faults/watchdog_stall.cpp)
target_link_libraries(h5ddp_watchdog_stall PRIVATE h5ddp_core h5ddp_warnings)
foreach(np 1 2 4)
  h5ddp_add_script_test(NAME faults_watchdog.np${np} LABELS faults TIMEOUT 150 PROCESSORS ${np}
    COMMAND /usr/bin/python3 ${H5DDP_FAULTS_PY}/watchdog_test.py ${np})
endforeach()

# ---- asynchronous checkpoints (issue 8) ----------------------------------------------------------
if(TARGET h5ddp_io)
  h5ddp_add_test_exe(async_checkpoint_test async_checkpoint_test.cpp)
  target_link_libraries(async_checkpoint_test PRIVATE h5ddp_io)
  h5ddp_add_mpi_test(NAME async_checkpoint EXE async_checkpoint_test RANKS 1 2 4 LABELS unit faults TIMEOUT 120)
endif()
