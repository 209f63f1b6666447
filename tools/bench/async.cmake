# h5ddp-bench-async: async vs sync checkpoint cost for the training loop (issue 8; driver
# tools/bench/async_bench.sh; results in docs/BENCHMARKS.md "## Async checkpoints"). Torch-free.
if(TARGET h5ddp_io)
  add_executable(h5ddp-bench-async ${CMAKE_CURRENT_SOURCE_DIR}/async_bench.cpp)
  target_link_libraries(h5ddp-bench-async PRIVATE h5ddp_io h5ddp_warnings)
endif()
