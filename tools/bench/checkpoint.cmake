# h5ddp-bench-checkpoint: h5ddp save/load vs raw MPI-IO vs rank-0 torch::pickle_save/load
# (driver: tools/bench/checkpoint_bench.sh; results in docs/BENCHMARKS.md "## Checkpoint").
add_executable(h5ddp-bench-checkpoint ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_bench.cpp)
target_link_libraries(h5ddp-bench-checkpoint PRIVATE h5ddp_io torch h5ddp_warnings)
target_compile_options(h5ddp-bench-checkpoint PRIVATE -Wno-unused-parameter -Wno-sign-compare)

# h5ddp-bench-hash: the XXH3 kernels side by side (results in docs/BENCHMARKS.md "### Checksums").
add_executable(h5ddp-bench-hash ${CMAKE_CURRENT_SOURCE_DIR}/hash_bench.cpp)
target_include_directories(h5ddp-bench-hash PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(h5ddp-bench-hash PRIVATE h5ddp_io h5ddp_warnings)
