# Tests on a real, private one-node Slurm (tests/slurm/local_slurm.sh starts and stops it by PID).
# They need root (slurmd) and Debian's slurm-wlm + munge; they share one lock so that two clusters never
# compete for the CPUs of a small CI machine (timing of the preemption test).
set(H5DDP_SLURM_DIR ${CMAKE_CURRENT_SOURCE_DIR}/slurm)

if(TARGET h5ddp-env)
  # The same checks without Slurm (mpirun at 1, 2, 4 ranks): runs where Slurm tests are skipped (not root).
  h5ddp_add_script_test(NAME env.discovery.mpirun LABELS unit mpi TIMEOUT 120
    COMMAND bash ${H5DDP_SLURM_DIR}/discovery_test.sh --mpirun-only $<TARGET_FILE:h5ddp-env>)
  h5ddp_add_script_test(NAME slurm.discovery LABELS slurm TIMEOUT 180
    COMMAND bash ${H5DDP_SLURM_DIR}/discovery_test.sh $<TARGET_FILE:h5ddp-env>)
  set_tests_properties(slurm.discovery PROPERTIES RESOURCE_LOCK h5ddp_slurm SKIP_RETURN_CODE 77)
endif()

# Preemption end to end: jobs/train.sbatch on 2 tasks, preempted twice mid-run (USR1 to the batch shell,
# then a higher-priority partition's job), each time save + exit 75 + requeue + resume; the final
# checkpoint must equal an uninterrupted mpirun's (h5ddp-ckpt diff when built, else h5py).
if(TARGET h5ddp-train)
  set(ckpt_tool "")
  if(TARGET h5ddp-ckpt)
    set(ckpt_tool $<TARGET_FILE:h5ddp-ckpt>)
  endif()
  h5ddp_add_script_test(NAME slurm.preempt LABELS slurm slow TIMEOUT 600
    COMMAND bash ${H5DDP_SLURM_DIR}/preempt_test.sh $<TARGET_FILE:h5ddp-train> ${ckpt_tool})
  set_tests_properties(slurm.preempt PROPERTIES RESOURCE_LOCK h5ddp_slurm SKIP_RETURN_CODE 77)
endif()

# jobs/train-local.sh (mpirun, no Slurm): TERM mid-run -> save + exit 75; rerun resumes and completes with
# a final checkpoint equal to an uninterrupted run's.
if(TARGET h5ddp-train)
  h5ddp_add_script_test(NAME jobs.train_local LABELS slow TIMEOUT 300
    COMMAND bash ${H5DDP_SLURM_DIR}/train_local_test.sh $<TARGET_FILE:h5ddp-train> ${ckpt_tool})
endif()
