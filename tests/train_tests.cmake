# Tests of the trainer layer: data, sampler, models, torch state binding (unit), and h5ddp-train script
# tests: options, exact resume after SIGKILL, elastic resume, signals, a killed rank.
h5ddp_add_test_exe(train_data_test data_test.cpp sampler_test.cpp)
target_link_libraries(train_data_test PRIVATE h5ddp_train)
h5ddp_add_mpi_test(NAME train_data EXE train_data_test RANKS 1 LABELS unit TIMEOUT 120)

h5ddp_add_test_exe(train_torch_test models_test.cpp torch_state_test.cpp hdf5_binding_test.cpp)
target_link_libraries(train_torch_test PRIVATE h5ddp_train)
target_compile_options(train_torch_test PRIVATE -Wno-unused-parameter -Wno-sign-compare)
h5ddp_add_mpi_test(NAME train_torch EXE train_torch_test RANKS 1 LABELS unit TIMEOUT 120)

if(TARGET h5ddp-train)
  set(train_script_dir ${CMAKE_CURRENT_SOURCE_DIR}/train)
  h5ddp_add_script_test(NAME train_options LABELS mpi TIMEOUT 300
    COMMAND bash ${train_script_dir}/options.sh)
  foreach(np 1 2 4)
    foreach(opt adam sgd)
      h5ddp_add_script_test(NAME train_resume_exact.${opt}.np${np} LABELS mpi slow TIMEOUT 300 PROCESSORS ${np}
        COMMAND bash ${train_script_dir}/resume_exact.sh ${np} ${opt})
    endforeach()
    h5ddp_add_script_test(NAME train_signal_one_rank.np${np} LABELS mpi slow TIMEOUT 300 PROCESSORS ${np}
      COMMAND bash ${train_script_dir}/signal_one_rank.sh ${np})
  endforeach()
  foreach(opt adam sgd)
    h5ddp_add_script_test(NAME train_resume_elastic.${opt} LABELS mpi slow TIMEOUT 300 PROCESSORS 4
      COMMAND bash ${train_script_dir}/resume_elastic.sh ${opt})
  endforeach()
  h5ddp_add_script_test(NAME train_async_equals_sync.np2 LABELS mpi TIMEOUT 300 PROCESSORS 2
    COMMAND bash ${train_script_dir}/async_equals_sync.sh 2)
  foreach(np 2 4)
    h5ddp_add_script_test(NAME train_kill_one_rank.np${np} LABELS mpi slow TIMEOUT 300 PROCESSORS ${np}
      COMMAND bash ${train_script_dir}/kill_one_rank.sh ${np})
  endforeach()
endif()
