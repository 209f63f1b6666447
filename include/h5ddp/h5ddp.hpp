// Everything an adopter's training loop uses, in one include (h5ddp::h5ddp links it; tools/examples/own_loop.cpp):
// MpiEnv and MpiComm (ranks, communicators), DistributedDataParallel (gradients), ShardedDataParallel (ZeRO-1/2),
// FullyShardedDataParallel (ZeRO-3) and ShardedOptimizer,
// Checkpointer (save, resume, signals), DistributedSampler (the data order), ScriptModule (models from Python).
// It includes <torch/torch.h>: keep it out of headers that many files include.
#pragma once

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/checkpointer.hpp"
#include "h5ddp/comm.hpp"
#include "h5ddp/ddp.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/fsdp.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "h5ddp/sampler.hpp"
#include "h5ddp/script_module.hpp"
#include "h5ddp/sharded_optimizer.hpp"
#include "h5ddp/stop_signal.hpp"
