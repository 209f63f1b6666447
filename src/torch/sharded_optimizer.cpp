#include "h5ddp/sharded_optimizer.hpp"

#include "h5ddp/error.hpp"

namespace h5ddp {

ShardedOptimizer::ShardedOptimizer(DistributedDataParallel& ddp, const Factory& make) : ddp_(ddp) {
  if (!ddp.options().sharded())
    throw ConfigError(
        "ShardedOptimizer: the DistributedDataParallel was built without DdpOptions::shard, so every rank holds "
        "every gradient; set it (ZeRO-1/2) or use a plain optimizer over model->parameters()");
  local_ = make(ddp.owned_parameters());
  if (local_ == nullptr) throw ConfigError("ShardedOptimizer: the optimizer factory returned null");
}

void ShardedOptimizer::step() {
  local_->step();
  ddp_.gather_parameters();
}

std::vector<ParamPiece> ShardedOptimizer::pieces() const {
  std::vector<ParamPiece> out;
  for (const OwnedPiece& p : ddp_.owned_pieces())
    out.push_back(ParamPiece{ddp_.parameter_names()[p.index], p.row_begin, p.row_end, p.tensor});
  return out;
}

void ShardedOptimizer::set_lr(double lr) {
  for (auto& group : local_->param_groups()) group.options().set_lr(lr);
}

}  // namespace h5ddp
