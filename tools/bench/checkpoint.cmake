# h5ddp-bench-checkpoint: h5ddp save/load vs raw MPI-IO vs rank-0 torch::pickle_save/load
# (driver: tools/bench/checkpoint_bench.sh; results in docs/BENCHMARKS.md "## Checkpoint").
add_executable(h5ddp-bench-checkpoint ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_bench.cpp)
target_link_libraries(h5ddp-bench-checkpoint PRIVATE h5ddp_io torch h5ddp_warnings)
target_compile_options(h5ddp-bench-checkpoint PRIVATE -Wno-unused-parameter -Wno-sign-compare)
