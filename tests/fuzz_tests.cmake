# Fuzzing the torch.save reader of `h5ddp-ckpt import` (tools/ckpt_torch/pickle.cpp, zip_directory.cpp).
#
# Two targets, each an LLVMFuzzerTestOneInput in tests/fuzz/:
#   pickle_fuzz     raw bytes as a data.pkl
#   torch_zip_fuzz  raw bytes as a whole .pt file (zip directory -> data.pkl -> storage record sizes)
# Each is built twice:
#   - <target>_replay, with the project's compiler and tests/fuzz/replay_main.cpp: runs the committed seed
#     corpus (tests/fuzz/corpus/, from make_corpus.py) as a unit test everywhere;
#   - pickle_fuzzer / torch_zip_fuzzer, with clang++-14 -fsanitize=fuzzer,address,undefined, only when clang++-14 and its libFuzzer
#     runtime are there (apt-get install clang-14 libclang-rt-14-dev). A custom command compiles the two
#     LibTorch-free sources with the fuzz entry straight into one binary (no second CMake project: nothing
#     else needs clang), and the `fuzz` tests run it for H5DDP_FUZZ_SECONDS from the seed corpus.
# By hand: build/tests/fuzz/pickle_fuzzer -dict=tests/fuzz/pickle.dict NEW_DIR tests/fuzz/corpus/pickle
# (new inputs go into NEW_DIR; copy a crashing input into the corpus once it is fixed).
option(H5DDP_FUZZ "Build the libFuzzer targets when clang++-14 is found" ON)
set(H5DDP_FUZZ_SECONDS 30 CACHE STRING "How long each ctest fuzz run lasts")

set(fuzz_dir ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
set(fuzz_reader_sources ${PROJECT_SOURCE_DIR}/tools/ckpt_torch/pickle.cpp
    ${PROJECT_SOURCE_DIR}/tools/ckpt_torch/zip_directory.cpp)
set(fuzz_reader_headers ${PROJECT_SOURCE_DIR}/tools/ckpt_torch/pickle.hpp
    ${PROJECT_SOURCE_DIR}/tools/ckpt_torch/zip_directory.hpp ${PROJECT_SOURCE_DIR}/include/h5ddp/error.hpp)

set(fuzz_cxx "")
if(H5DDP_FUZZ)
  find_program(H5DDP_FUZZ_CXX clang++-14)
  if(H5DDP_FUZZ_CXX)
    # Can it link a fuzzer? (clang-14 without libclang-rt-14-dev cannot.)
    set(probe ${CMAKE_CURRENT_BINARY_DIR}/fuzz/probe.cpp)
    file(WRITE ${probe} "#include <cstdint>\n#include <cstddef>\nextern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(COMMAND ${H5DDP_FUZZ_CXX} -fsanitize=fuzzer,address,undefined ${probe} -o ${probe}.bin
                    RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
    if(probe_rc EQUAL 0)
      set(fuzz_cxx ${H5DDP_FUZZ_CXX})
    else()
      message(STATUS "clang++-14 cannot link -fsanitize=fuzzer (apt-get install libclang-rt-14-dev): fuzz tests skipped")
    endif()
  else()
    message(STATUS "clang++-14 not found (apt-get install clang-14 libclang-rt-14-dev): fuzz tests skipped")
  endif()
endif()

foreach(target pickle_fuzz torch_zip_fuzz)
  add_executable(${target}_replay ${fuzz_dir}/replay_main.cpp ${fuzz_dir}/${target}.cpp)
  target_link_libraries(${target}_replay PRIVATE h5ddp_torch_file h5ddp_warnings)
  target_include_directories(${target}_replay PRIVATE ${PROJECT_SOURCE_DIR}/tools)
endforeach()
h5ddp_add_script_test(NAME fuzz.pickle_replay LABELS unit TIMEOUT 60 PROCESSORS 1
  COMMAND $<TARGET_FILE:pickle_fuzz_replay> ${fuzz_dir}/corpus/pickle)
h5ddp_add_script_test(NAME fuzz.torch_zip_replay LABELS unit TIMEOUT 60 PROCESSORS 1
  COMMAND $<TARGET_FILE:torch_zip_fuzz_replay> ${fuzz_dir}/corpus/zip)

if(fuzz_cxx)
  foreach(target pickle_fuzz torch_zip_fuzz)
    string(REPLACE "_fuzz" "_fuzzer" binary ${target})
    set(out ${CMAKE_CURRENT_BINARY_DIR}/fuzz/${binary})
    add_custom_command(OUTPUT ${out}
      COMMAND ${fuzz_cxx} -std=c++17 -g -O1 -fno-omit-frame-pointer
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
              -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/tools
              ${fuzz_dir}/${target}.cpp ${fuzz_dir}/fuzz_error.cpp ${fuzz_reader_sources} -o ${out}
      DEPENDS ${fuzz_dir}/${target}.cpp ${fuzz_dir}/fuzz_error.cpp ${fuzz_reader_sources} ${fuzz_reader_headers}
      COMMENT "Building the libFuzzer target ${binary} with clang++-14"
      VERBATIM)
    add_custom_target(${binary} ALL DEPENDS ${out})
  endforeach()
  # New inputs go to the build tree; the committed corpus is only read. -timeout: seconds per input;
  # -rss_limit_mb: PickleLimits allow ~2 GB, inputs here are a few KB, so 1 GB already means a leak of limits.
  foreach(kind pickle torch_zip)
    set(work ${CMAKE_CURRENT_BINARY_DIR}/fuzz/${kind}_corpus)
    file(MAKE_DIRECTORY ${work})
    if(kind STREQUAL "pickle")
      set(dict_arg -dict=${fuzz_dir}/pickle.dict)
      set(kind_dir pickle)
    else()
      set(dict_arg "")
      set(kind_dir zip)
    endif()
    h5ddp_add_script_test(NAME fuzz.${kind} LABELS fuzz TIMEOUT 300 PROCESSORS 1
      COMMAND ${CMAKE_CURRENT_BINARY_DIR}/fuzz/${kind}_fuzzer -max_total_time=${H5DDP_FUZZ_SECONDS} -timeout=10
              -rss_limit_mb=1024 -max_len=16384 -print_final_stats=1 ${dict_arg}
              -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/fuzz/${kind}- ${work} ${fuzz_dir}/corpus/${kind_dir})
  endforeach()
endif()
