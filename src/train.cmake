# h5ddp_train: data, sampler, models, LibTorch <-> TrainState adapter, trainer. Uses every layer below.
set(h5ddp_train_sources
  data.cpp
  sampler.cpp
  config.cpp
  lr_schedule.cpp
  stop_signal.cpp
  models.cpp
  torch_state.cpp)
if(TARGET h5ddp_io AND TARGET h5ddp_ddp)
  list(APPEND h5ddp_train_sources checkpointer.cpp trainer.cpp)
else()
  message(WARNING "h5ddp_io or h5ddp_ddp is missing: h5ddp_train is built without the trainer")
endif()
h5ddp_layer(h5ddp_train ${h5ddp_train_sources})
target_link_libraries(h5ddp_train PUBLIC h5ddp_core ZLIB::ZLIB PRIVATE Boost::program_options)
foreach(dep h5ddp_io h5ddp_ddp)
  if(TARGET ${dep})
    target_link_libraries(h5ddp_train PUBLIC ${dep})
  endif()
endforeach()
h5ddp_torch_target(h5ddp_train)
# Torch-free sources skip the precompiled <torch/torch.h>.
set_source_files_properties(data.cpp sampler.cpp config.cpp lr_schedule.cpp stop_signal.cpp
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
