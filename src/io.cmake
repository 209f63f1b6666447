# h5ddp_io: HDF5 handles, the checkpoint format, and checkpoints (no LibTorch, no NCCL).
h5ddp_layer(h5ddp_io
  h5.cpp
  format.cpp
  checkpoint_plan.cpp
  checkpoint_hash.cpp
  checkpoint_writer.cpp
  checkpoint_commit.cpp
  checkpoint_reader.cpp
  checkpoint_loader.cpp
  direct_read.cpp
  checkpoint_verify.cpp
  checkpoint_file.cpp
  async_checkpoint.cpp)
target_link_libraries(h5ddp_io PUBLIC h5ddp_core HDF5::HDF5 PRIVATE h5ddp_xxhash)
# Checksums are on every save's and load's path; XXH3 is compiled into checkpoint_hash.cpp (XXH_INLINE_ALL)
# and is 1.6x faster at -O3 than at -O2 on x86-64, whatever the build type.
set_source_files_properties(checkpoint_hash.cpp PROPERTIES COMPILE_OPTIONS -O3)
# On x86-64 an AVX2 build of XXH3 (xxh3_avx2.c, C only) is chosen at run time where the CPU has AVX2.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_sources(h5ddp_io PRIVATE xxh3_avx2.c)
  set_source_files_properties(xxh3_avx2.c PROPERTIES COMPILE_OPTIONS "-O3;-mavx2")
  set_source_files_properties(checkpoint_hash.cpp PROPERTIES COMPILE_DEFINITIONS H5DDP_XXH3_AVX2=1)
endif()
