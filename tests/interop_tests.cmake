# Interop with the real PyTorch (/usr/bin/python3 with Debian's python3-torch and python3-h5py): export,
# import, the README's snippets. Scripts in tests/interop/; each starts its own short h5ddp-train runs.
if(TARGET h5ddp-ckpt-torch AND TARGET h5ddp-ckpt AND TARGET h5ddp-train)
  set(H5DDP_INTEROP_PYTHON /usr/bin/python3)  # the interpreter of H5DDP_PYTHON in the test environment
  set(interop_args --train $<TARGET_FILE:h5ddp-train> --ckpt $<TARGET_FILE:h5ddp-ckpt>
      --mpiexec ${MPIEXEC_EXECUTABLE} --source-dir ${PROJECT_SOURCE_DIR}
      --work-dir ${CMAKE_CURRENT_BINARY_DIR}/interop_scratch)
  function(h5ddp_add_interop_test name)  # ARGN: labels
    h5ddp_add_script_test(NAME interop.${name} LABELS interop ${ARGN} TIMEOUT 300 PROCESSORS 2
      COMMAND ${H5DDP_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/test_${name}.py ${interop_args})
  endfunction()
  h5ddp_add_interop_test(export_eval mpi)       # runs h5ddp-train at 2 ranks
  h5ddp_add_interop_test(import_ddp mpi)
  h5ddp_add_interop_test(readme mpi)
  h5ddp_add_interop_test(roundtrip_errors)
  # Damaged and hostile .pt files through `h5ddp-ckpt import` (issue 23), one test per kind of damage.
  foreach(case deep_nesting huge_dict truncated_zip truncated_pickle bad_memo oversized_sizes valid_variants)
    h5ddp_add_script_test(NAME interop.hostile.${case} LABELS interop TIMEOUT 300 PROCESSORS 1
      COMMAND ${H5DDP_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/test_hostile_pickle.py --case ${case}
              ${interop_args})
  endforeach()
endif()
