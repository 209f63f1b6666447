# h5ddp-ckpt: info / verify / diff (subcommands in tools/ckpt/, one file each).
add_executable(h5ddp-ckpt h5ddp_ckpt.cpp ckpt/common.cpp ckpt/info.cpp ckpt/verify.cpp ckpt/diff.cpp ckpt/torch_tool.cpp)
target_include_directories(h5ddp-ckpt PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(h5ddp-ckpt PRIVATE h5ddp_io h5ddp_warnings)
install(TARGETS h5ddp-ckpt)
