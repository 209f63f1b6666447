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

# ---- end-to-end fault tests through h5ddp-train and h5ddp-ckpt (tests/faults/*.py) ----------------------
# The full SIGKILL matrix (4 save phases x one rank / all ranks, 2 phases inside the `latest` update and one
# between retention's removals, on rank 0) runs at 2 ranks; 1 and 4 ranks and the
# asynchronous save run a few cases, so the label stays a few minutes on a 2-core machine.
if(TARGET h5ddp-train AND TARGET h5ddp-ckpt)
  function(h5ddp_add_fault_test name np timeout)
    h5ddp_add_script_test(NAME faults_${name} LABELS faults TIMEOUT ${timeout} PROCESSORS ${np}
      COMMAND /usr/bin/python3 ${ARGN})
    set_tests_properties(faults_${name} PROPERTIES SKIP_RETURN_CODE 77)
  endfunction()
  h5ddp_add_fault_test(kill.np2 2 900 ${H5DDP_FAULTS_PY}/kill_test.py 2)
  h5ddp_add_fault_test(kill.np1 1 300 ${H5DDP_FAULTS_PY}/kill_test.py 1
    --cases mid_data:all,before_latest:all,latest_written:all)
  h5ddp_add_fault_test(kill.np4 4 400 ${H5DDP_FAULTS_PY}/kill_test.py 4 --cases mid_data:3,before_rename:all)
  h5ddp_add_fault_test(kill_async.np2 2 300 ${H5DDP_FAULTS_PY}/kill_test.py 2 --async-checkpoint
    --cases mid_data:all,before_rename:1)
  # Issue 23: the order of a save's fsyncs and renames, traced with strace (SKIP without strace or ptrace).
  h5ddp_add_fault_test(durability.np1 1 300 ${H5DDP_FAULTS_PY}/durability_test.py 1)
  h5ddp_add_fault_test(durability.np2 2 300 ${H5DDP_FAULTS_PY}/durability_test.py 2)
  h5ddp_add_fault_test(corrupt.np2 2 600 ${H5DDP_FAULTS_PY}/corrupt_test.py 2)
  h5ddp_add_fault_test(diskfull.np2 2 400 ${H5DDP_FAULTS_PY}/diskfull_test.py 2)
  # One ctest per case where a case may not run here (mounting a tmpfs needs root): it shows as skipped,
  # never as part of a pass.
  function(h5ddp_add_fault_case name np timeout script case)
    h5ddp_add_fault_test(${name} ${np} ${timeout} ${script} ${np})
    set_tests_properties(faults_${name} PROPERTIES ENVIRONMENT "${H5DDP_TEST_ENV};H5DDP_FAULTS_ONLY=${case}")
  endfunction()
  foreach(case read_only_run_dir missing_run_dir_under_read_only_parent run_dir_is_a_file missing_run_dir_is_created)
    h5ddp_add_fault_case(rundir.${case}.np2 2 300 ${H5DDP_FAULTS_PY}/rundir_test.py test_${case})
  endforeach()
  # Issue 23: bad inputs through the public commands (exit code, one line, no abort report, nothing lost).
  h5ddp_add_fault_test(bad_input.np2 2 900 ${H5DDP_FAULTS_PY}/bad_input_test.py 2)
  set_tests_properties(faults_diskfull.np2 faults_rundir.read_only_run_dir.np2
    faults_rundir.missing_run_dir_under_read_only_parent.np2 PROPERTIES RUN_SERIAL ON)
endif()
