# h5ddp-ckpt-torch: the LibTorch subcommands of h5ddp-ckpt (export, import, eval), a separate executable so
# that h5ddp-ckpt info/verify/diff link only HDF5. h5ddp-ckpt execs it from its own directory.
#
# h5ddp_torch_file: the pickle and zip-directory readers of torch.save files, without LibTorch, so that
# tests/fuzz/ can build them alone (with clang's libFuzzer and sanitizers) and replay their corpus.
add_library(h5ddp_torch_file STATIC ckpt_torch/pickle.cpp ckpt_torch/zip_directory.cpp)
target_include_directories(h5ddp_torch_file PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(h5ddp_torch_file PUBLIC h5ddp_core PRIVATE h5ddp_warnings)

if(TARGET h5ddp_train AND TARGET h5ddp_io)
  add_executable(h5ddp-ckpt-torch h5ddp_ckpt_torch.cpp ckpt_torch/torch_pickle.cpp ckpt_torch/interop.cpp)
  target_include_directories(h5ddp-ckpt-torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(h5ddp-ckpt-torch PRIVATE h5ddp_torch_file h5ddp_train h5ddp_io h5ddp_warnings)
  target_compile_options(h5ddp-ckpt-torch PRIVATE -Wno-unused-parameter -Wno-sign-compare)
  if(H5DDP_USE_PCH)
    target_precompile_headers(h5ddp-ckpt-torch PRIVATE <torch/torch.h>)
  endif()
  install(TARGETS h5ddp-ckpt-torch)
endif()
