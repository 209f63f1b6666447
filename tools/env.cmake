# h5ddp-env: prints rank/size/local rank/nodes/host per rank (checks launcher discovery; used by the Slurm tests).
add_executable(h5ddp-env h5ddp_env.cpp)
target_link_libraries(h5ddp-env PRIVATE h5ddp_core h5ddp_warnings)
install(TARGETS h5ddp-env)
