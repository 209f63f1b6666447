# h5ddp-bench-ddp: DDP step time vs local step vs PyTorch DDP (driver: tools/bench/ddp_bench.sh).
add_executable(h5ddp-bench-ddp ${CMAKE_CURRENT_SOURCE_DIR}/ddp_bench.cpp)
target_link_libraries(h5ddp-bench-ddp PRIVATE h5ddp_ddp h5ddp_warnings)
target_compile_options(h5ddp-bench-ddp PRIVATE -Wno-unused-parameter -Wno-sign-compare)
