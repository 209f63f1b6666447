# h5ddp-train: the training job (tools/h5ddp_train.cpp, a short main over h5ddp_train).
if(TARGET h5ddp_train AND TARGET h5ddp_io AND TARGET h5ddp_ddp)
  add_executable(h5ddp-train ${CMAKE_CURRENT_SOURCE_DIR}/h5ddp_train.cpp)
  target_link_libraries(h5ddp-train PRIVATE h5ddp_train h5ddp_warnings)
  install(TARGETS h5ddp-train)
endif()
