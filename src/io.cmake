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
  checkpoint_verify.cpp
  checkpoint_file.cpp
  async_checkpoint.cpp)
target_link_libraries(h5ddp_io PUBLIC h5ddp_core HDF5::HDF5 PRIVATE h5ddp_xxhash)
# Checksums are on every save's and load's path; XXH3 is compiled into checkpoint_hash.cpp (XXH_INLINE_ALL)
# and is 1.6x faster at -O3 than at -O2 on x86-64, whatever the build type.
set_source_files_properties(checkpoint_hash.cpp PROPERTIES COMPILE_OPTIONS -O3)
