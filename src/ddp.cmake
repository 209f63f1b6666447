# h5ddp_ddp: bucketing (pure) and the DistributedDataParallel wrapper. LibTorch, no HDF5.
h5ddp_layer(h5ddp_ddp bucketing.cpp ddp.cpp)
target_link_libraries(h5ddp_ddp PUBLIC h5ddp_core)
h5ddp_torch_target(h5ddp_ddp)
